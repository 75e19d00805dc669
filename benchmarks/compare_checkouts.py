"""Is a change token-identical and no slower? Two checkouts of sbd decode the same workloads, taking turns
in one run.

Each turn is a fresh process whose `sbd` comes from one checkout (PYTHONPATH): it loads the model, warms up,
then times `sbd.generate` with the model's defaults (sbd-verify, the settings the model records) on every
prompt alone and, where the workload says, on all of them as one batch. The checkouts alternate within
every round (old, new, then new, old), so a slow moment of a shared machine hits both. Reported: the
median seconds per checkout, new/old, and whether tokens and forwards are the same.

    python benchmarks/compare_checkouts.py --old OLD --rounds 3 --out benchmarks/results/checkouts_NAME

OLD: a worktree of the commit before the change (`git worktree add OLD COMMIT`); --new defaults to this
checkout. Both must run with this Python (the same installed packages).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
WORKLOADS = {
    # the demo model as bench_demo times it: held-out task problems, batch 1 and a batch of 8
    "demo": dict(model="demo", prompts="tasks", n=30, max_new_tokens=64, chat=False, batch=8),
    # SmolLM2 with its shipped drafter: held-out GSM problems through the chat template, batch 1
    "smollm2": dict(model="smollm2", prompts="task:gsm_symbolic?split=test&n={n}&seed=0", n=6, max_new_tokens=128,
                    chat=True, batch=0),
    # the same on the held-out mixed set of the vLLM benchmarks (HumanEval stubs and five reasoning-gym tasks)
    "smollm2-mixed": dict(model="smollm2", prompts="mixed", n=6, max_new_tokens=128, chat=True, batch=0),
    # the same two with int4 weights (`sbd.load(..., weights="int4")`)
    "smollm2-int4": dict(model="smollm2", prompts="task:gsm_symbolic?split=test&n={n}&seed=0", n=6,
                         max_new_tokens=128, chat=True, batch=0, weights="int4"),
    "smollm2-int4-mixed": dict(model="smollm2", prompts="mixed", n=6, max_new_tokens=128, chat=True, batch=0,
                               weights="int4"),
    # the same two with every layer float32 (`weights="float"`)
    "smollm2-float": dict(model="smollm2", prompts="task:gsm_symbolic?split=test&n={n}&seed=0", n=6,
                          max_new_tokens=128, chat=True, batch=0, weights="float"),
    "smollm2-float-mixed": dict(model="smollm2", prompts="mixed", n=6, max_new_tokens=128, chat=True, batch=0,
                                weights="float"),
}


def _prompts(w: dict) -> list:
    if w["prompts"] == "tasks":
        from sbd.tasks import make_split

        names = ("chain_sum", "number_sorting", "word_sequence_reversal")
        per = max(1, w["n"] // len(names))
        return [ex["prompt"] for t in names for ex in make_split(t, "test", per, 0)]
    if w["prompts"] == "mixed":
        sys.path.insert(0, str(HERE.parent / "vllm"))
        from causal_masks import prompt_sets

        return prompt_sets(w["n"])["mixed"]
    from sbd.tasks.prompts import load_prompts

    return load_prompts(w["prompts"].format(n=w["n"]))


def worker(name: str) -> dict:
    """One turn: decode the workload with this process's sbd; seconds, forwards and a digest of the tokens."""
    import torch

    import sbd

    torch.set_num_threads(int(os.environ.get("SBD_THREADS", "2")))
    w = WORKLOADS[name]
    model, tok = sbd.load(w["model"], **({"weights": w["weights"]} if "weights" in w else {}))
    prompts = _prompts(w)
    kw = dict(max_new_tokens=w["max_new_tokens"], chat=w["chat"])
    sbd.generate(model, tok, prompts[:1], **{**kw, "max_new_tokens": 4})  # warm-up
    out = {"sbd": str(Path(sbd.__file__).resolve().parent.parent.name)}
    tokens, nfe, start = [], 0, time.perf_counter()
    for p in prompts:
        r = sbd.generate(model, tok, [p], **kw)
        tokens += r.token_ids
        nfe += sum(r.nfe)
    out["alone"] = {"seconds": time.perf_counter() - start, "nfe": nfe, "tokens": sum(map(len, tokens)),
                    "digest": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]}
    if w["batch"]:
        start, tokens, nfe = time.perf_counter(), [], 0
        for i in range(0, len(prompts), w["batch"]):
            r = sbd.generate(model, tok, prompts[i:i + w["batch"]], **kw)
            tokens += r.token_ids
            nfe += sum(r.nfe)
        out[f"batch {w['batch']}"] = {"seconds": time.perf_counter() - start, "nfe": nfe,
                                      "tokens": sum(map(len, tokens)),
                                      "digest": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]}
    return out


def turn(checkout: Path, name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, str(HERE), "--worker", name], env=env, cwd=str(checkout), capture_output=True,
                          text=True)  # cwd: its sbd, not the one in the folder this was started from
    if done.returncode != 0:
        raise SystemExit(f"{checkout} / {name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(runs: dict, names: list[str]) -> str:
    """The medians per checkout, new/old, and whether tokens and forwards are the same (forwards: old → new)."""
    lines = ["| workload | decoding | old s (median) | new s (median) | new/old | same tokens | forwards old → new |",
             "|---|---|---|---|---|---|---|"]
    for n in names:
        for key in [k for k, v in runs[n]["old"][0].items() if isinstance(v, dict)]:
            old = [x[key] for x in runs[n]["old"]]
            new = [x[key] for x in runs[n]["new"]]
            o, w = statistics.median(x["seconds"] for x in old), statistics.median(x["seconds"] for x in new)
            same = len({x["digest"] for x in old + new}) == 1
            nfe = sorted({x["nfe"] for x in old}), sorted({x["nfe"] for x in new})
            forwards = "same" if nfe[0] == nfe[1] and len(nfe[0]) == 1 else f"{nfe[0]} → {nfe[1]}"
            lines.append(f"| {n} | {key} | {o:.2f} | {w:.2f} | {w / o:.3f} | {'yes' if same else 'NO'} | {forwards} |")
    return "\n".join(lines)


def header(args) -> str:
    """What ran where: the command, the machine, the threads, and a forward-cost cache when one was set."""
    from sbd.decoding.width_cost import _cpu_name

    cache = os.environ.get("SBD_COSTS_CACHE")
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {_cpu_name()}, {os.cpu_count()} cores, "
            f"{os.environ.get('SBD_THREADS', '2')} threads; old {args.old.name}, new {args.new.name}, {args.rounds} "
            f"rounds; model defaults{f'; SBD_COSTS_CACHE={Path(cache).name}' if cache else ''}.\n\n"
            f"    python benchmarks/compare_checkouts.py --old OLD --rounds {args.rounds} --workloads {args.workloads}\n\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", type=Path, help="the checkout before the change")
    p.add_argument("--new", type=Path, default=HERE.parent.parent, help="the checkout after (default: this one)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs both checkouts on every workload")
    p.add_argument("--workloads", default="demo,smollm2", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--out", type=Path, default=None, help="folder for results.json and compare.md")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    names = args.workloads.split(",")
    runs = {n: {"old": [], "new": []} for n in names}
    for r in range(args.rounds):
        for n in names:
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for which in order:
                res = turn(args.old if which == "old" else args.new, n)
                runs[n][which].append(res)
                print(f"round {r + 1} {n} {which}: " + ", ".join(f"{k} {v['seconds']:.2f} s" for k, v in res.items()
                                                                 if isinstance(v, dict)), flush=True)
    table = report(runs, names)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(runs, indent=1))
        (args.out / "compare.md").write_text(header(args) + table + "\n")


if __name__ == "__main__":
    main()
