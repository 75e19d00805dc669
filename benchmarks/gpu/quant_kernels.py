"""Weight-only int8/int4 linear layers (`sbd.models.quantized`) on the device against its bf16 linear: time per
call at Llama-3.1-8B's layer shapes, error against the weights they hold, and whether each row of a 16-row
product is bit for bit the same row alone (row invariance: what makes sbd-verify on quantized weights give
NTP's tokens exactly). One step of benchmarks/gpu/first_call.sh; writes quant_kernels.json and .md.

    python benchmarks/gpu/quant_kernels.py --device cuda --out DIR
    python benchmarks/gpu/quant_kernels.py --device cpu --quick --out DIR     (the dry run's tiny shapes)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sbd.models import quantized  # noqa: E402

SHAPES_8B = {"q/o 4096x4096": (4096, 4096), "gate/up 4096->14336": (4096, 14336),
             "down 14336->4096": (14336, 4096), "output 4096->128256": (4096, 128256)}
SHAPES_QUICK = {"tiny 128->256": (128, 256)}
ROWS = (1, 16)


def _timed(fn, x, device, repeats: int) -> float:
    """Median milliseconds of one call, after two untimed ones."""
    for _ in range(2):
        fn(x)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(device: torch.device, shapes: dict, repeats: int) -> list[dict]:
    quantized.check_kernels(device)
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, (k, n) in shapes.items():
        lin = nn.Linear(k, n, bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, k, generator=g) * k ** -0.5)
        lin = lin.to(device=device, dtype=torch.bfloat16)
        x = torch.randn(max(ROWS), k, generator=g).to(device=device, dtype=torch.bfloat16)
        layers = {"bf16": lin}
        for fmt in quantized.FORMATS:
            layers[fmt] = quantized.QuantizedLinear.from_linear(lin, fmt)
        with torch.no_grad():
            want = x.float() @ lin.weight.float().t()
            for fmt, layer in layers.items():
                wide = layer(x)
                alone = torch.cat([layer(x[i:i + 1]) for i in range(x.shape[0])])
                row = {"shape": name, "k": k, "n": n, "format": getattr(layer, "fmt", fmt),
                       "relative error": float((wide.float() - want).norm() / want.norm()),
                       "row invariant": bool(torch.equal(wide, alone))}
                for m in ROWS:
                    row[f"ms, {m} rows"] = _timed(layer, x[:m], device, repeats)
                rows.append(row)
                print(json.dumps(row), flush=True)
        del layers, lin
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def write(rows: list[dict], device: torch.device, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "command": " ".join(sys.argv)}
    (out / "quant_kernels.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Weight-only linear layers on {name}", "", f"torch {torch.__version__}, CUDA {torch.version.cuda}; "
             f"`{meta['command']}`; bf16 activations, median of the timed calls.", "",
             "| layer | format | ms, 1 row | ms, 16 rows | x bf16 (1 row) | relative error | row invariant |",
             "|---|---|---:|---:|---:|---:|---|"]
    base = {r["shape"]: r["ms, 1 rows"] for r in rows if r["format"] == "bf16"}
    for r in rows:
        lines.append(f"| {r['shape']} | {r['format']} | {r['ms, 1 rows']:.4f} | {r['ms, 16 rows']:.4f} | "
                     f"{r['ms, 1 rows'] / base[r['shape']]:.2f} | {r['relative error']:.2e} | {r['row invariant']} |")
    (out / "quant_kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="one tiny shape (the dry run on a CPU)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    rows = measure(device, SHAPES_QUICK if args.quick else SHAPES_8B, args.repeats)
    write(rows, device, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
