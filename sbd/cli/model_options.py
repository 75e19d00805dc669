"""The model a timing command runs on: a model folder (`--model`) or a random-weight model with the
shapes of a real one (`--shape`), on `--device` in `--dtype`. Shared by `sbd bench` and `sbd forward-cost`."""

from __future__ import annotations

DTYPES = ("float32", "bfloat16", "float16")


NARROW_HELP = ("linear layers of few-token forwards as W·xᵀ (on) or as torch's F.linear (off); auto: on for float32 "
               "on an AMD CPU, as sbd.load does (see sbd.models.narrow_linear)")


from .args import add_weights_option, weights_arg


def add_model_options(p, shape_help: str, narrow_choices=("auto", "on", "off"), narrow_help: str = NARROW_HELP) -> None:
    from ..benchmarking.presets import SHAPES

    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", metavar="PATH", help="local model folder (safetensors), or demo")
    what.add_argument("--shape", choices=sorted(SHAPES), help=shape_help)
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: cpu)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="weights and compute dtype (default: float32 on CPU, the checkpoint's or bfloat16 elsewhere)")
    p.add_argument("--narrow-linear", choices=narrow_choices, default="auto", help=narrow_help)
    add_weights_option(p)


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
        from ..models.narrow_linear import use_narrow_linear, worth_it

        model = random_model_like(args.shape, dtype=dtype, device=args.device)
        narrow = _narrow(args)
        use_narrow_linear(model, worth_it(args.device, dtype) if narrow is None else narrow)
        from ..models.quantized import FORMATS, quantize

        if weights_arg(args) in FORMATS:  # --weights holds for a random model too, never silently dropped
            quantize(model, weights_arg(args))
        return model, None
    from ..models.loading import load

    return load(args.model, device=args.device, dtype=dtype, narrow_linear=_narrow(args), weights=weights_arg(args))


def _narrow(args) -> bool | None:
    """--narrow-linear as sbd.load takes it (None: its default); `both` loads with the default."""
    return {"on": True, "off": False}.get(getattr(args, "narrow_linear", "auto"))
