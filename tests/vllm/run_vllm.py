"""Run vLLM (CPU build) once on a model folder and print/save its outputs as JSON (vLLM's venv).

    python tests/vllm/run_vllm.py MODEL --mode {plain,sbd,ngram} --prompts prompts.json --out out.json
        [--max-tokens 48] [--temperature 0] [--batch all|1] [--spec-tokens N] [--override key=value ...]

prompts.json: a list of token-id lists (token ids, so the tokenizers of vLLM and Hugging Face cannot
differ). --batch all submits every prompt at once (vLLM batches them); --batch 1 one after another.
mode sbd: SBDLlamaForCausalLM (hf_overrides) + SBDProposer (custom_class); mode ngram: vLLM's ngram
proposer; plain: no speculation. The model runs eagerly (enforce_eager) unless --compiled (vLLM's default:
every forward compiled, those with masks too). Output: {"tokens": [[...], ...], "seconds": generation wall
time, "stats": the sbd proposer's counters (mode sbd; `eager_forwards` among them), "spec": vLLM's
spec-decode counters}.
Pin it to one core (see tests/vllm/README.md).
"""

import argparse
import json
import os
import tempfile
import time


def build(args):
    from vllm import LLM

    kw = dict(model=args.model, dtype=args.dtype, enforce_eager=not args.compiled, max_model_len=args.max_model_len,
              max_num_seqs=args.max_num_seqs, seed=0, disable_log_stats=False, enable_prefix_caching=args.prefix_caching)
    if args.block_size:
        kw["block_size"] = args.block_size
    if args.kv_blocks:
        kw["num_gpu_blocks_override"] = args.kv_blocks
    overrides = {}
    for item in args.override:
        k, v = item.split("=", 1)
        overrides[k] = json.loads(v)
    if args.mode == "sbd":
        with open(os.path.join(args.model, "config.json")) as f:
            arch = json.load(f)["architectures"][0]
        from sbd.integrations.vllm.plugin import architecture_for

        overrides["architectures"] = [architecture_for(arch)]
        kw["speculative_config"] = {"method": "custom_class",
                                    "model": "sbd.integrations.vllm.proposer.SBDProposer",
                                    "num_speculative_tokens": args.spec_tokens}
    elif args.mode == "ngram":
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": args.spec_tokens}
        if not args.ngram_default_window:
            kw["speculative_config"].update(prompt_lookup_max=3, prompt_lookup_min=2)
    if overrides:
        kw["hf_overrides"] = overrides
    return LLM(**kw)


def spec_counters(llm):
    try:
        metrics = llm.get_metrics()
    except Exception:  # noqa: BLE001 (metrics are a nicety)
        return {}
    out = {}
    for m in metrics:
        if m.name.startswith(("vllm:spec_decode", "vllm:prefix_cache", "vllm:num_preemptions")) and hasattr(m, "value"):
            out[m.name] = m.value
    return out


def read_stats(path):
    if not os.path.getsize(path):
        return {}
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--mode", choices=["plain", "sbd", "ngram"], default="sbd")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    ap.add_argument("--batch", default="all", choices=["all", "1"])
    ap.add_argument("--spec-tokens", type=int, default=7)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prefix-caching", action="store_true")
    ap.add_argument("--compiled", action="store_true", help="vLLM's default (compiled) instead of enforce_eager")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--ngram-default-window", action="store_true", help="ngram: vLLM's default lookup window")
    ap.add_argument("--block-size", type=int, default=None, help="KV block size (CPU default 128; a multiple of 32)")
    ap.add_argument("--kv-blocks", type=int, default=None,
                    help="KV cache blocks in all (vLLM's num_gpu_blocks_override): few force preemptions")
    ap.add_argument("--repeat", type=int, default=1, help="time this many passes (tokens from the last)")
    ap.add_argument("--then", help="a second prompts file run after the timed passes in the same engine (its "
                    "tokens go to 'then'): with --prefix-caching, prompts that extend the first ones' outputs hit "
                    "blocks written while masks were in flight")
    ap.add_argument("--trace", help="SBD_VLLM_TRACE file: the proposer's drafts, one JSON line per request and step")
    ap.add_argument("--override", action="append", default=[], help="hf_overrides key=json value")
    args = ap.parse_args()

    stats_file = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    os.environ["SBD_VLLM_STATS"] = stats_file  # inherited by vLLM's worker process
    if args.trace:
        open(args.trace, "w").close()
        os.environ["SBD_VLLM_TRACE"] = args.trace
    t0 = time.time()
    llm = build(args)
    startup = time.time() - t0
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    with open(args.prompts) as f:
        prompts = json.load(f)
    sp = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True, seed=args.seed)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], sp, use_tqdm=False)  # warm-up
    before = read_stats(stats_file)
    spec_before = spec_counters(llm)
    seconds = []
    for _ in range(args.repeat):
        t = time.time()
        if args.batch == "all":
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        else:
            outs = [llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)[0] for p in prompts]
        seconds.append(time.time() - t)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    after = read_stats(stats_file)
    stats = {k: v if isinstance(v, bool) else v - before.get(k, 0) for k, v in after.items()}  # the timed passes
    spec = {k: v - spec_before.get(k, 0) for k, v in spec_counters(llm).items()}
    then = None
    if args.then:
        with open(args.then) as f:
            more = json.load(f)
        outs2 = llm.generate([TokensPrompt(prompt_token_ids=p) for p in more], sp, use_tqdm=False)
        then = [list(o.outputs[0].token_ids) for o in outs2]
    result = {"mode": args.mode, "tokens": tokens, "seconds": seconds, "startup": startup, "stats": stats,
              "spec": spec, "generated": sum(len(t) for t in tokens), "then": then,
              "prefix_cache_hits": spec_counters(llm).get("vllm:prefix_cache_hits", 0),
              "preemptions": spec.get("vllm:num_preemptions", 0)}
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print("RESULT", json.dumps({k: v for k, v in result.items() if k not in ("tokens", "then")}))


if __name__ == "__main__":
    main()
