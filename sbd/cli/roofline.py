"""`sbd roofline`: the paper's roofline tables reproduced from its printed code, next to a corrected
whole-model roofline for the same cells; writes roofline.md, roofline.json and roofline.png."""

from __future__ import annotations

from .args import positive_list as parse_sizes
from .eval import _argtype
from .args import count_list as parse_counts

PAPER_KV = [2 ** 4, 2 ** 8, 2 ** 10, 2 ** 12, 2 ** 14, 2 ** 16, 2 ** 20, 2 ** 22]


def add_roofline_parser(sub):
    from ..benchmarking.roofline_presets import HARDWARE, MODELS

    p = sub.add_parser(
        "roofline", help="the paper's predicted slowdown tables (reproduced) and a corrected roofline",
        description="Table 3 (time(k)/time(1)) and Table 4 (eq.-16 wall-clock speedup at NFE speedups 2, 4, 8) of "
                    "the paper, computed from its printed roofline code, next to the same cells from a whole-model "
                    "roofline (every layer, gate projection, output layer, correct K/V widths) for --model on "
                    "--hardware. Writes roofline.md, roofline.json and roofline.png to --out.")
    p.add_argument("--model", choices=sorted(MODELS), default="llama-3.1-8b-fp8",
                   help="model shapes and dtypes of the corrected roofline (default: llama-3.1-8b-fp8, the paper's)")
    p.add_argument("--hardware", choices=sorted(HARDWARE), default="h100-fp8",
                   help="peak FLOP/s and bandwidth of the corrected roofline (default: h100-fp8, the paper's)")
    p.add_argument("--batch-size", type=_argtype(parse_sizes), default=[1, 4, 8, 16], metavar="LIST",
                   help="batch sizes (default: 1,4,8,16, the paper's)")
    p.add_argument("--cached", type=_argtype(parse_counts), default=PAPER_KV, metavar="LIST",
                   help="KV cache lengths (default: the paper's, 2^4 to 2^22)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the three files (created)")
    return p


def cmd_roofline(args):
    from ..benchmarking.report import write_roofline
    from ..benchmarking.roofline_presets import HARDWARE, MODELS

    paths, text = write_roofline(MODELS[args.model], HARDWARE[args.hardware], args.batch_size, args.cached, args.out)
    print(text)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return paths
