"""The model a timing command runs on: a model folder (`--model`) or a random-weight model with the
shapes of a real one (`--shape`), on `--device` in `--dtype`. Shared by `sbd bench` and `sbd forward-cost`."""

from __future__ import annotations

DTYPES = ("float32", "bfloat16", "float16")


def add_model_options(p, shape_help: str) -> None:
    from ..benchmarking.presets import SHAPES

    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", metavar="PATH", help="local model folder (safetensors), or demo")
    what.add_argument("--shape", choices=sorted(SHAPES), help=shape_help)
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="weights and compute dtype (default: float32 on CPU, the checkpoint's or bfloat16 elsewhere)")


def model_from_args(args):
    """(model, tokenizer): the loaded folder, or the random model of `--shape` with no tokenizer."""
    import torch

    dtype = getattr(torch, args.dtype) if args.dtype else None
    if args.shape:
        from ..benchmarking.presets import random_model_like
        from ..models.loading import check_device

        check_device(args.device)
        if dtype is None:
            dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
        return random_model_like(args.shape, dtype=dtype, device=args.device), None
    from ..models.loading import load

    return load(args.model, device=args.device, dtype=dtype)
