"""vLLM plain and vLLM + sbd's drafts with and without tcmalloc and Intel OpenMP preloaded (LD_PRELOAD, as
`sbd serve --engine vllm` sets it: sbd.integrations.vllm.launch.cpu_environment), interleaved.

    python benchmarks/vllm/preload.py --n 4 --rounds 2 [--max-tokens 128] [--model smollm2]

Each round starts two vLLM processes, preload on and off (the order alternates between rounds: on/off,
off/on, ...), since LD_PRELOAD acts at a process's start. Each process builds both engines (plain, then
with sbd's drafts, the weights in bfloat16 as the server gives them), decodes one warm-up prompt on each,
then times `--n` chat prompts one after another (batch 1, greedy) on each. Prints tokens/s per round and
the medians; the machine should be otherwise idle, and vLLM's compile cache warm (a first start compiles).
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

QUESTIONS = ["Tom has 3 boxes of 12 pencils and gives away 7 pencils. How many pencils does he have left?",
             "Write a short paragraph about why the sky is blue.",
             "A train travels 60 km in 45 minutes. What is its average speed in km per hour?",
             "List five fruits and one fact about each.",
             "If a shirt costs $25 after a 20% discount, what was its original price?",
             "Explain in three sentences what a hash table is.",
             "Sara reads 18 pages a day. How many days does she need for a 243-page book?",
             "Give three tips for writing clear emails."]


def worker(args) -> None:
    """In vLLM's environment: both engines, timed; one JSON line on stdout."""
    from vllm import LLM, SamplingParams

    from sbd.integrations.vllm.launch import engine_settings

    s = engine_settings(args.model_dir, args.adapter)
    common = dict(model=args.weights, dtype=args.dtype, max_model_len=2048, max_num_seqs=4, seed=0)
    engines = {"plain": LLM(**common),
               "sbd": LLM(**common, hf_overrides=s["hf_overrides"], speculative_config=s["speculative_config"])}
    tok = engines["plain"].get_tokenizer()
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
               for q in QUESTIONS[: args.n]]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    out = {}
    for name, llm in engines.items():
        llm.generate(["Hello, how are you?"], params, use_tqdm=False)  # warm-up
        t, generated = time.perf_counter(), 0
        for p in prompts:
            generated += len(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids)
        out[name] = generated / (time.perf_counter() - t)
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4, help="prompts per timing (batch 1)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds; each runs preload on and off once")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--adapter", help=argparse.SUPPRESS)
    ap.add_argument("--weights", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from sbd.decoding.width_cost import _cpu_name
    from sbd.integrations.vllm import environment, launch

    python = environment.check()
    model_dir, adapter = launch.resolve_model(args.model)
    weights, dtype = launch.weights_for_vllm(model_dir)
    runs = {True: [], False: []}
    for r in range(args.rounds):
        for preload in ((True, False) if r % 2 == 0 else (False, True)):
            os.environ[launch.PRELOAD_ENV] = "1" if preload else "0"  # the user's switch
            env = launch.cpu_environment(args.threads)
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"
            cmd = [str(python), __file__, "--worker", "--model-dir", str(model_dir), "--adapter", str(adapter),
                   "--weights", str(weights), "--dtype", dtype or "auto", "--n", str(args.n),
                   "--max-tokens", str(args.max_tokens)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            if done.returncode != 0 or not line:
                raise SystemExit(f"the worker failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
            result = json.loads(line[-1][7:])
            runs[preload].append(result)
            print(f"round {r}, preload {'on ' if preload else 'off'} ({env.get('LD_PRELOAD', '')}): "
                  + ", ".join(f"{k} {v:.1f} tok/s" for k, v in result.items()), flush=True)
    print(f"\n{time.strftime('%Y-%m-%d', time.gmtime())}; {_cpu_name()}, {os.cpu_count()} cores; vLLM "
          f"{environment.VERSION}; {args.model}, {dtype or 'its own dtype'}; {args.n} prompts at batch 1, greedy, "
          f"{args.max_tokens} new tokens at most; medians of {args.rounds}")
    print("| engine | preload on, tok/s | preload off, tok/s | on / off |\n|---|---:|---:|---:|")
    for name in ("plain", "sbd"):
        on = statistics.median(r[name] for r in runs[True])
        off = statistics.median(r[name] for r in runs[False])
        print(f"| vLLM {'plain' if name == 'plain' else '+ sbd'} | {on:.1f} | {off:.1f} | {on / off:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
