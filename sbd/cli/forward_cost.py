"""`sbd forward-cost`: measured time(w)/time(1) per block width, batch size and cached length for any
model on any device, optionally next to a roofline prediction; writes forward_cost.json/.md/.png."""

from __future__ import annotations

import shlex
import sys

from ..errors import SBDError
from .args import count_list as parse_counts
from .args import positive_int as _positive
from .args import positive_list as parse_sizes
from .eval import _argtype
from .model_options import add_model_options, model_from_args

def parse_attentions(text: str) -> list[str]:
    from ..benchmarking.forward_cost import ATTENTIONS

    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ATTENTIONS]
    if not names or bad:
        raise SBDError(f"attention paths are {', '.join(ATTENTIONS)}, got {text!r}")
    return names


def add_forward_cost_parser(sub):
    from ..benchmarking.roofline_presets import HARDWARE

    p = sub.add_parser(
        "forward-cost", help="measured time of a w-token forward relative to a 1-token forward (and a roofline)",
        description="Time the forwards SBD makes — w new tokens over a KV cache of a given length — for every "
                    "width, batch size and cached length, widths interleaved round by round, medians after warm-up. "
                    "With --hardware, the roofline prediction for the same model shapes is printed and plotted next "
                    "to the measurement. Writes forward_cost.json, forward_cost.md and forward_cost.png to --out.")
    add_model_options(p, "a random-weight Llama with these shapes (time depends on shapes, not weights)")
    p.add_argument("--widths", type=_argtype(parse_sizes), default=None, metavar="LIST",
                   help="new tokens per forward (default: those of 1,2,4,8,16,32,64 that fit over every --cached "
                        "length within the model's context); each given must fit")
    p.add_argument("--batch-size", type=_argtype(parse_sizes), default=[1], metavar="LIST",
                   help="batch sizes (default: 1)")
    p.add_argument("--cached", type=_argtype(parse_counts), default=[256], metavar="LIST",
                   help="tokens already in the KV cache (default: 256)")
    p.add_argument("--repeats", type=_positive, default=10, help="timed rounds; medians reported (default: 10)")
    p.add_argument("--hardware", choices=[*sorted(HARDWARE), "measured"], default=None,
                   help="also predict with the roofline of this hardware preset, or of this machine's measured matmul "
                        "FLOP/s and copy bandwidth (measured)")
    p.add_argument("--attention", type=_argtype(parse_attentions), default=["auto"], metavar="LIST",
                   help="attention paths to time side by side, comma-separated: auto (what decoding runs for rows of "
                        "one length: no mask tensor), rows (what it runs for a ragged batch: one per-row mask), dense "
                        "(Hugging Face's SDPA with a dense mask, key/value heads copied: the path before sbd's own); "
                        "default: auto")
    p.add_argument("--compile", action="store_true",
                   help="time every shape eagerly and through torch.compile (CUDA: CUDA graphs), in the same rounds; "
                        "each compiled shape compiles once, untimed (seconds to minutes per shape)")
    p.add_argument("--threads", type=_positive, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the three files (created)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def cmd_forward_cost(args) -> dict:
    import torch

    from dataclasses import replace

    from ..benchmarking.floor import floor_of
    from ..benchmarking.forward_cost import WIDTHS, fits, forward_cost_table
    from ..benchmarking.report import write_forward_cost
    from ..benchmarking.roofline import ModelShape
    from ..benchmarking.roofline_presets import HARDWARE
    from ..models import extension
    from ..models.narrow_linear import uses_narrow_linear

    if args.threads:
        torch.set_num_threads(args.threads)
    extension.prepare(args.device)  # compiled before anything is timed (once per machine)
    model = model_from_args(args)[0]
    name = args.shape or str(args.model)
    widths = args.widths
    if widths is None:
        widths = [w for w in WIDTHS if fits(model, w, args.cached)]
        if len(widths) < len(WIDTHS):
            left = ", ".join(str(w) for w in WIDTHS if w not in widths)
            print(f"sbd: default widths {left} left out: they do not fit over {max(args.cached)} cached tokens "
                  f"within the model's context", file=sys.stderr)
    rows = forward_cost_table(model, widths=widths, batches=args.batch_size, cached=args.cached,
                              repeats=args.repeats, progress=not args.no_progress, attentions=args.attention,
                              compile=(False, True) if args.compile else (False,))
    floor = floor_of(model)  # the bytes this model reads as loaded, over this machine's read bandwidth
    predicted = None
    if args.hardware:
        if args.hardware == "measured":
            from ..benchmarking.hardware import measure_hardware

            hw = measure_hardware(args.device, model.dtype)
        else:
            hw = HARDWARE[args.hardware]
        size = torch.finfo(model.dtype).bits / 8
        shape = ModelShape.from_config(model.config, kv_bytes=size, name=name)
        # bytes per weight as loaded: quantized layers read their int values and scales, not float32
        per_weight = floor.weight_bytes / shape.weight_count
        predicted = (hw, replace(shape, weight_bytes=per_weight, act_bytes=size))
    command = shlex.join(["sbd", *sys.argv[1:]]) if sys.argv[1:2] == ["forward-cost"] else None
    from ..models.quantized import QuantizedLinear, weights_format

    quantized_weights = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantizedLinear))
    meta = {"model": name, "parameters": sum(p.numel() for p in model.parameters()) + quantized_weights,
            "weights": weights_format(model) or "as loaded", "dtype": str(model.dtype).replace("torch.", ""),
            "device": _device_name(model), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "repeats": args.repeats, "command": command,
            "narrow_linear": uses_narrow_linear(model)}
    paths, text = write_forward_cost(rows, args.out, meta, predicted, floor)
    print(text)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return paths


def _device_name(model) -> str:
    import platform

    import torch

    device = model.get_input_embeddings().weight.device
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"
