"""The same server on Ray Serve: replicas of the FastAPI app, each a process with its own model and engine.

Ray Serve puts one HTTP proxy in front and routes each request to a replica; each replica decodes its
requests with continuous batching as `sbd serve` does. A fixed number of replicas (`replicas`) or
autoscaling (`autoscaling`, Ray's own config: min/max replicas and the ongoing requests per replica
to aim for; a sensible target is the engine's `max_batch`). Needs `pip install 'sbd-lm[ray]'`.
"""

from __future__ import annotations

from dataclasses import asdict

from ..errors import SBDError


def application(model: str, *, adapter: str | None = None, config=None, threads: int | None = 1,
                replicas: int = 1, autoscaling: dict | None = None, device: str = "cpu", weights: bool | str = True):
    """A Ray Serve application serving `model` (a folder, demo or smollm2) with `replicas` replicas (or
    `autoscaling`); `config` is a `ServerConfig` for every replica; `weights` as `sbd.load` takes it."""
    try:
        from ray import serve
    except ImportError:
        raise SBDError("Ray Serve is not installed: pip install 'sbd-lm[ray]'") from None
    from .config import ServerConfig

    config = config or ServerConfig()
    fields = asdict(config)
    limits = fields.pop("limits")

    def build():  # runs inside each replica: its own model, tokenizer and engine thread
        import torch

        from ..models.loading import load
        from .app import create_app
        from .config import Limits, ServerConfig

        if threads:
            torch.set_num_threads(threads)
        m, tok = load(model, adapter=adapter, device=device, weights=weights)
        return create_app(m, tok, ServerConfig(**fields, limits=Limits(**limits) if limits else None))

    options = {"ray_actor_options": {"num_cpus": threads or 1}}
    if autoscaling:
        options["autoscaling_config"] = autoscaling
    else:
        options["num_replicas"] = replicas
    replica = serve.deployment(serve.ingress(build)(), name="sbd", **options)
    return replica.bind()


def run_ray(model: str, config, *, adapter: str | None = None, device: str = "cpu", host: str = "127.0.0.1",
            port: int = 8000, threads: int = 1, replicas: int = 1, weights: bool | str = True) -> None:
    """`sbd serve --replicas N`: start Ray locally, run the application, block until Ctrl-C."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise SBDError("sbd serve --replicas needs Ray Serve: pip install 'sbd-lm[ray]'") from None

    ray.init(include_dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    app = application(model, adapter=adapter, config=config, threads=threads, replicas=replicas, device=device,
                      weights=weights)
    print(f"serving {config.model_name!r} on http://{host}:{port}/v1 with {replicas} Ray Serve "
          "replicas; Ctrl-C stops", flush=True)
    serve.run(app, blocking=True)
