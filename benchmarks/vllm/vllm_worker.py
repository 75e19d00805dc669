"""One vLLM engine (run with vLLM's environment's python), timed on every prompt set at batch 1 (one
request after another) and with the prompts of all sets submitted at once, for several passes; one JSON
file out.
`bench_engines.py` runs it once per engine configuration.

    VLLM_PY benchmarks/vllm/vllm_worker.py --model DIR --mode {plain,ngram,sbd} --sets sets.json --out o.json

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", default=None, help="mode sbd: the drafting adapter folder")
    ap.add_argument("--mode", choices=["plain", "ngram", "sbd"], required=True)
    ap.add_argument("--sets", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--ngram-tokens", type=int, default=8)
    ap.add_argument("--dtype", default=None, help="vLLM's dtype (default: its own, bfloat16 on this CPU)")
    args = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(model=args.model, max_model_len=2048, max_num_seqs=16, seed=0, disable_log_stats=False)
    if args.dtype:
        kw["dtype"] = args.dtype
    if args.mode == "sbd":
        from sbd.integrations.vllm.launch import engine_settings

        s = engine_settings(args.model, args.adapter)
        kw.update(hf_overrides=s["hf_overrides"], speculative_config=s["speculative_config"])
    elif args.mode == "ngram":
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": args.ngram_tokens,
                                    "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    t0 = time.perf_counter()
    llm = LLM(**kw)
    start = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    sets = json.loads(open(args.sets).read())
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in next(iter(sets.values()))[:2]], params,
                 use_tqdm=False)  # warm-up
    settings = json.loads(json.dumps({k: v for k, v in kw.items() if k != "model"}))
    if "hf_overrides" in settings:  # recorded without this machine's folders
        settings["hf_overrides"]["sbd_adapter"] = os.path.relpath(settings["hf_overrides"]["sbd_adapter"])
    result = {"mode": args.mode, "settings": settings, "start_seconds": start,
              "runs": []}
    phases = [(name, prompts, "1") for name, prompts in sets.items()]  # one request after another, per set
    phases.append(("+".join(sets), [q for ps in sets.values() for q in ps], "all"))  # every prompt at once
    for p in range(args.passes):
        for name, prompts, batch in phases:
            if True:
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
                result["runs"].append({"pass": p, "set": name, "batch": batch, "seconds": seconds,
                                       "generated": sum(map(len, tokens)), "accepted": accepted, "tokens": tokens})
                print(f"{args.mode} pass {p} {name} batch {batch}: {seconds:.1f} s", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
