"""`sbd serve`: the OpenAI-compatible server (sbd.serving) on uvicorn, or on Ray Serve with --replicas."""

from __future__ import annotations

from ..errors import SBDError
from .args import gamma_value as _gamma
from .args import positive_int as _positive


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                       description="Serve --model over HTTP: POST /v1/completions and /v1/chat/completions "
                                   "(stream with \"stream\": true), GET /v1/models, /health, /metrics. Requests are "
                                   "decoded together, each at its own pace (continuous batching). A request may set "
                                   "method, block_size, gamma, proxy, draft, max_tokens, temperature, seed, stop; what it "
                                   "leaves out takes the defaults below (greedy sbd-verify: the model's own answers). "
                                   "Ctrl-C finishes the running requests, then stops. Needs the serve extra: "
                                   "pip install 'sbd-lm[serve]'.")
    p.add_argument("--model", required=True, help="model folder, demo, or smollm2 (with its shipped adapter)")
    p.add_argument("--adapter", default=None, help="drafting adapter folder to attach to --model")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--served-name", default=None, help="the model name clients send (default: --model's name)")
    p.add_argument("--max-batch", type=_positive, default=8, help="requests decoded at once (default: 8)")
    p.add_argument("--max-queue", type=_positive, default=64,
                   help="requests that may wait for a free row; beyond it: HTTP 429 (default: 64)")
    p.add_argument("--max-model-len", type=_positive, default=None,
                   help="cache positions per request, prompt + max_tokens + scratch (default: min(2048, context))")
    p.add_argument("--method", default="sbd-verify", choices=["sbd-verify", "sbd", "ntp"],
                   help="default decoding method (default: sbd-verify, the model's exact answers)")
    p.add_argument("--block-size", type=_positive, default=None,
                   help="default block size (default: the adapter's trained size, else 16)")
    p.add_argument("--draft", default="adaptive", choices=["adaptive", "block", "eb"],
                   help="default sbd-verify drafting: adaptive = each request picks its draft length (up to the "
                        "block size, or plain next-token steps) from its own acceptance and the forward costs timed "
                        "at start-up; block = whole blocks; eb = revealed by the EB rule first (default: adaptive)")
    p.add_argument("--gamma", type=_gamma, default=0.35, help="default EB bound for method sbd (default: 0.35)")
    p.add_argument("--max-tokens", type=_positive, default=256, help="default max_tokens (default: 256)")
    p.add_argument("--max-tokens-limit", type=_positive, default=1024,
                   help="largest max_tokens a request may ask (default: 1024)")
    p.add_argument("--prefill", default="separate", choices=["separate", "mixed"],
                   help="newcomers' prompts in a forward of their own, or inside the shared one (default: separate)")
    p.add_argument("--threads", type=_positive, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--replicas", type=_positive, default=None,
                   help="run on Ray Serve with this many replicas, each with its own engine (needs ray[serve])")


def server_config(args, model):
    from ..decoding.generate import context_limit
    from ..serving.app import ServerConfig
    from ..serving.protocol import Limits

    limit = context_limit(model) or 2048
    length = args.max_model_len or min(2048, limit)
    if length > limit:
        raise SBDError(f"--max-model-len {length} exceeds the model's context of {limit}")
    if args.max_tokens > args.max_tokens_limit:
        raise SBDError("--max-tokens exceeds --max-tokens-limit")
    limits = Limits(method=args.method, draft=args.draft, block_size=args.block_size, gamma=args.gamma,
                    max_tokens=args.max_tokens,
                    max_tokens_limit=args.max_tokens_limit)
    name = args.served_name or str(args.model).rstrip("/").rsplit("/", 1)[-1]
    return ServerConfig(model_name=name, max_batch=args.max_batch, max_queue=args.max_queue, max_model_len=length,
                        prefill=args.prefill, limits=limits)


def cmd_serve(args) -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise SBDError("sbd serve needs the serve extra: pip install 'sbd-lm[serve]' (fastapi, uvicorn, "
                       "prometheus-client)") from None
    import torch

    from ..models.loading import load

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.replicas:
        from ..serving.ray_app import run_ray

        run_ray(args)
        return
    model, tokenizer = load(args.model, adapter=args.adapter, device=args.device)
    config = server_config(args, model)
    from ..serving.app import create_app

    app = create_app(model, tokenizer, config)
    print(f"serving {config.model_name!r} on http://{args.host}:{args.port}/v1 ({config.max_batch} rows, "
          f"default method {config.limits.method}); Ctrl-C stops", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
