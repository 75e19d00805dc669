"""The campaign's training state, carried across sessions and machines in the repository: the newest
adapter (small enough to commit) and its AdamW moments (bfloat16), which `save` writes but git ignores.

    python benchmarks/smollm2/campaign/state.py save runs/campaign/ab/cheap/checkpoint-187 \
        --record '{"sequences_seen": 3272, ...}'      (writes benchmarks/smollm2/data/campaign/state/)
    python benchmarks/smollm2/campaign/state.py restore runs/campaign/start   (an adapter folder again)

A sampler head trained over the adapter (`sbd train --sampler-head-only`) is kept beside it as its own
files (HEAD_FILES: copied in by hand from the head run's checkpoint, with its record) and restored too.

When the state's adapter and head are the shipped ones (`ship`: copied into sbd/adapters/smollm2, keeping
that folder's model card, training record and recorded decoding defaults), the state keeps no second copy
of them: state.json then names the folder they live in ("weights_in"), and `restore` reads them there.

    python benchmarks/smollm2/campaign/state.py ship

The next session warm-starts from the restored folder: `sbd train --adapter lora --model runs/campaign/start ...`.
The moments are kept so that a later optimizer-aware warm start can use them; `sbd train` does not read
them yet (a warm start begins a fresh AdamW with its own warm-up). They are not committed: 11.6 MB would
keep a checkout from travelling to a GPU machine (tests/test_checkout_size.py). The last ones committed
are in git commit aa20b3e:
    git show aa20b3e:benchmarks/smollm2/data/campaign/state/optimizer_moments.safetensors > \
        benchmarks/smollm2/data/campaign/state/optimizer_moments.safetensors
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[3]
STATE = Path(__file__).resolve().parents[1] / "data" / "campaign" / "state"
SHIPPED = ROOT / "sbd" / "adapters" / "smollm2"
WEIGHTS = ("adapter_model.safetensors", "sampler_head_config.json", "sampler_head.safetensors")
HEAD_FILES = ("sampler_head_config.json", "sampler_head.safetensors", "sampler_head_state.json")


def save(checkpoint: Path, record: dict) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    shutil.copy(checkpoint / "adapter_config.json", STATE / "adapter_config.json")
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(STATE / "adapter_model.safetensors"))
    opt = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=False)
    moments = {f"{i}.{name}": t.to(torch.bfloat16).contiguous()
               for i, state in opt["state"].items() for name, t in state.items() if t.dim() > 0}
    save_file(moments, str(STATE / "optimizer_moments.safetensors"))
    trainer = json.loads((checkpoint / "trainer_state.json").read_text())
    record = {**record, "global_step": trainer["global_step"], "checkpoint": str(checkpoint)}
    (STATE / "state.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"saved {checkpoint} to {STATE}")


def weights_home() -> Path:
    """Where the state's adapter and head weights are: the state folder, or the shipped folder after `ship`."""
    record = json.loads((STATE / "state.json").read_text())
    return ROOT / record["weights_in"] if "weights_in" in record else STATE


def restore(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    home = weights_home()
    for name in ("adapter_config.json", "state.json"):
        shutil.copy(STATE / name, out / name)
    shutil.copy(home / "adapter_model.safetensors", out / "adapter_model.safetensors")
    for name in HEAD_FILES:  # the sampler head trained over this adapter, when there is one
        src = STATE / name if (STATE / name).is_file() else home / name
        if src.is_file():
            shutil.copy(src, out / name)
    print(f"restored the campaign's adapter to {out} (sequences seen: "
          f"{json.loads((STATE / 'state.json').read_text())['sequences_seen']})")


def ship() -> None:
    """The state's adapter and head become the shipped SmolLM2 drafter; the state then points there."""
    if weights_home() == SHIPPED:
        raise SystemExit("the state's weights are already the shipped ones")
    for name in WEIGHTS:
        if (STATE / name).is_file():
            shutil.copy(STATE / name, SHIPPED / name)
    shipped_cfg = json.loads((SHIPPED / "adapter_config.json").read_text())
    state_cfg = json.loads((STATE / "adapter_config.json").read_text())
    # the adapter's shape comes from the state; the recorded decoding defaults stay the shipped folder's
    (SHIPPED / "adapter_config.json").write_text(json.dumps({**state_cfg, **{k: v for k, v in shipped_cfg.items()
                                                             if k == "decoding"}}, indent=1) + "\n")
    for name in WEIGHTS:
        (STATE / name).unlink(missing_ok=True)
    record = json.loads((STATE / "state.json").read_text())
    record["weights_in"] = str(SHIPPED.relative_to(ROOT))
    (STATE / "state.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"shipped the campaign state's adapter and head to {SHIPPED}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("checkpoint", type=Path)
    s.add_argument("--record", required=True, help="JSON: sequences_seen, distinct_answers, data, command, cpu_seconds")
    r = sub.add_parser("restore")
    r.add_argument("out", type=Path)
    sub.add_parser("ship", help="make the state's adapter and head the shipped ones (sbd/adapters/smollm2)")
    args = ap.parse_args()
    if args.cmd == "save":
        save(args.checkpoint, json.loads(args.record))
    elif args.cmd == "ship":
        ship()
    else:
        restore(args.out)


if __name__ == "__main__":
    main()
