"""One vLLM engine (run with vLLM's environment's python), timed on every prompt set at batch 1 (one
request after another) and with the prompts of all sets submitted at once, for several passes; one JSON
file out.
`bench_engines.py` runs it once per engine configuration, or once for all of them (`--interleaved`).

    VLLM_PY benchmarks/vllm/vllm_worker.py --model DIR --mode {plain,ngram,sbd} --sets sets.json --out o.json
    VLLM_PY benchmarks/vllm/vllm_worker.py --model DIR --mode plain,ngram,sbd --sets sets.json --out FOLDER

sets.json: {"set name": [[token ids], ...]}. mode sbd: the plug-in's class and proposer, as
`sbd serve --engine vllm` runs them (sbd.integrations.vllm.launch.engine_settings); ngram: vLLM's own
prompt lookup; plain: no speculation. vLLM's defaults otherwise (its dtype and compilation, as a user
runs it). Tokens per forward: generated tokens over engine steps per request, G / (G - accepted), from
vLLM's own spec-decode counters (each step of a request yields 1 + its accepted draft tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode") and hasattr(m, "value"):
            out[m.name] = m.value
    return out


def build(mode: str, args):
    """One engine of `mode`, as a user would start it; returns (LLM, settings as recorded, start seconds)."""
    from vllm import LLM

    kw = dict(model=args.model, max_model_len=2048, max_num_seqs=16, seed=0, disable_log_stats=False)
    if args.dtype:
        kw["dtype"] = args.dtype
    if mode == "sbd":
        from sbd.integrations.vllm.launch import engine_settings

        s = engine_settings(args.model, args.adapter)
        kw.update(hf_overrides=s["hf_overrides"], speculative_config=s["speculative_config"])
        for item in args.sbd_override:  # e.g. sbd_masks=0 with sbd_lookup=false: never draft (plain steps)
            key, value = item.split("=", 1)
            kw["hf_overrides"][key] = json.loads(value)
    elif mode == "ngram":
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": args.ngram_tokens,
                                    "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    t0 = time.perf_counter()
    llm = LLM(**kw)
    start = time.perf_counter() - t0
    settings = json.loads(json.dumps({k: v for k, v in kw.items() if k != "model"}))
    if "hf_overrides" in settings:  # recorded without this machine's folders
        settings["hf_overrides"]["sbd_adapter"] = os.path.relpath(settings["hf_overrides"]["sbd_adapter"])
    return llm, settings, start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", default=None, help="mode sbd: the drafting adapter folder")
    ap.add_argument("--mode", required=True,
                    help="plain, ngram or sbd; several, comma-separated: one engine each in this process, their "
                         "passes interleaved (pass p of every engine before pass p + 1 of any), one JSON file each "
                         "(--out is then a folder: vllm_MODE.json)")
    ap.add_argument("--sets", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--ngram-tokens", type=int, default=8)
    ap.add_argument("--dtype", default=None, help="vLLM's dtype (default: its own, bfloat16 on this CPU)")
    ap.add_argument("--sbd-override", action="append", default=[],
                    help="mode sbd: a plug-in setting as KEY=JSON (hf_overrides), e.g. sbd_masks=0; repeatable")
    args = ap.parse_args()
    modes = args.mode.split(",")
    if not modes or any(m not in ("plain", "ngram", "sbd") for m in modes) or len(set(modes)) != len(modes):
        raise SystemExit(f"--mode: plain, ngram and/or sbd, each once; got {args.mode!r}")

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    sets = json.loads(open(args.sets).read())
    engines, results = {}, {}
    for mode in modes:
        llm, settings, start = build(mode, args)
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in next(iter(sets.values()))[:2]], params,
                     use_tqdm=False)  # warm-up
        engines[mode] = llm
        results[mode] = {"mode": mode, "settings": settings, "start_seconds": start, "interleaved_with": modes,
                         "runs": []}
    phases = [(name, prompts, "1") for name, prompts in sets.items()]  # one request after another, per set
    phases.append(("+".join(sets), [q for ps in sets.values() for q in ps], "all"))  # every prompt at once
    for p in range(args.passes):
        for name, prompts, batch in phases:
            for i in range(len(modes)):  # interleaved, and the order rotated every pass
                mode = modes[(i + p) % len(modes)]
                llm = engines[mode]
                before = counters(llm)
                t = time.perf_counter()
                if batch == "1":
                    outs = [llm.generate([TokensPrompt(prompt_token_ids=q)], params, use_tqdm=False)[0] for q in prompts]
                else:
                    outs = llm.generate([TokensPrompt(prompt_token_ids=q) for q in prompts], params, use_tqdm=False)
                seconds = time.perf_counter() - t
                after = counters(llm)
                tokens = [list(o.outputs[0].token_ids) for o in outs]
                accepted = after.get("vllm:spec_decode_num_accepted_tokens", 0) - before.get(
                    "vllm:spec_decode_num_accepted_tokens", 0)
                if mode not in (modes[-1], "plain"):  # several engines in one process: vLLM's metrics are the
                    accepted = None                      # last one's only (plain accepts nothing anyway)
                results[mode]["runs"].append({"pass": p, "set": name, "batch": batch, "seconds": seconds,
                                              "generated": sum(map(len, tokens)), "accepted": accepted,
                                              "tokens": tokens})
                print(f"{mode} pass {p} {name} batch {batch}: {seconds:.1f} s", flush=True)
    if len(modes) == 1:
        with open(args.out, "w") as f:
            json.dump(results[modes[0]], f)
        return
    os.makedirs(args.out, exist_ok=True)
    for mode, result in results.items():
        with open(os.path.join(args.out, f"vllm_{mode}.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
