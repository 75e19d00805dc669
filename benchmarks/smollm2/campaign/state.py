"""The campaign's training state, carried across sessions and machines in the repository (issue 27,
item 4): the newest adapter and its AdamW moments, small enough to commit (bfloat16, about 19 MB).

    python benchmarks/smollm2/campaign/state.py save runs/campaign/ab/cheap/checkpoint-187 \
        --record '{"sequences_seen": 3272, ...}'      (writes benchmarks/smollm2/data/campaign/state/)
    python benchmarks/smollm2/campaign/state.py restore runs/campaign/start   (an adapter folder again)

A sampler head trained over the adapter (`sbd train --sampler-head-only`) is kept beside it as its own
files (HEAD_FILES: copied in by hand from the head run's checkpoint, with its record) and restored too.

The next session warm-starts from the restored folder: `sbd train --adapter lora --model runs/campaign/start ...`.
The moments are kept so that a later optimizer-aware warm start can use them; `sbd train` does not read
them yet (a warm start begins a fresh AdamW with its own warm-up).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

STATE = Path(__file__).resolve().parents[1] / "data" / "campaign" / "state"
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


def restore(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_config.json", "adapter_model.safetensors", "state.json"):
        shutil.copy(STATE / name, out / name)
    for name in HEAD_FILES:  # the sampler head trained over this adapter, when there is one
        if (STATE / name).is_file():
            shutil.copy(STATE / name, out / name)
    print(f"restored the campaign's adapter to {out} (sequences seen: "
          f"{json.loads((STATE / 'state.json').read_text())['sequences_seen']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("checkpoint", type=Path)
    s.add_argument("--record", required=True, help="JSON: sequences_seen, distinct_answers, data, command, cpu_seconds")
    r = sub.add_parser("restore")
    r.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.cmd == "save":
        save(args.checkpoint, json.loads(args.record))
    else:
        restore(args.out)


if __name__ == "__main__":
    main()
