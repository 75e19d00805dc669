"""Weight-only quantized linear layers, int8 and int4: on sbd's own products on a CPU, on PyTorch's kernels
elsewhere (CUDA; a CPU without a C++ compiler).

Why: at batch 1 a forward reads every weight once, so its time follows the weights' bytes. SmolLM2-135M in
float32 reads 538 MB per forward; with int4 layers and an int8 output layer 95 MB. On a 2-core EPYC a
whole one-token forward took 22.2 ms in float32 and 11.4 ms with int4 layers
(benchmarks/results/quantized_linear/results.md, which also compares torchao: its CPU int4 is a prototype
over the same kernel, and its int8 path reconverts the weight on every eager call).

torch's kernels: `torch._weight_int8pack_mm` (int8 weight [N, K], one scale per output row) and
`torch._weight_int4pack_mm_for_cpu` (4-bit values q in groups of 32 along K, w = (q - 8)·scale + zero per
group and row). On CUDA the same formats run on `torch._weight_int4pack_mm` (the "tinygemm" kernel, same
w = (q - 8)·scale + zero, its own packing) and CUDA's `torch._weight_int8pack_mm`. All are private ops of
torch: `check_kernels` runs each once on a small product on the model's device before a model is
quantized, so a torch without them is refused in one line rather than failing mid-decoding.
On torch's kernels activations enter in bfloat16 (the kernels' fast path; float32 activations take a scalar
loop 20-50x slower) and the output is widened back to the model's dtype; everything outside the linear
layers stays as loaded.

On a CPU sbd's own products replace torch's kernels (`sbd/native/products.h`, in sbd's compiled extension,
`sbd.models.extension`), in GGUF's own forms: groups of 32 inputs per output row with float16 numbers, int8
as q·d (Q8_0's) and int4 as q·d + m (Q4_1's), each weight formed exactly so before it is summed, the
activations taken in float32 as the model holds them (torch's kernels round them to bfloat16 on the way in
and the products on the way out), summed in a fixed order, the weights read once per call whatever the rows.
Weights that came from such a file are therefore held bit for bit (`sbd.models.lossless`, the CPU default).
torch's CPU kernels are also bound by their arithmetic: SmolLM2's int8 output layer took 2.2 ms of a 10.8 ms
int4 forward on a 2-core Xeon, and its int4 layers 4.9 ms (sbd's: 4.3 ms). Which kernels a model's layers
run is chosen once, when `quantize` makes them (the extension is built then, synchronously, once per
machine), and kept for the model's life: a model never changes kernels mid-way, so its tokens never depend
on when a build finished. Where the extension cannot be built, or with `SBD_NATIVE=0`, torch's kernels run.

Exactness: the kernels are row-invariant, i.e. row i of a many-row product is bit for bit the product
of row i alone. With attention computed per committed token (the "exact" plan of
`sbd.decoding.attention`), a verifying forward's committed positions are then bitwise the one-token
forwards of NTP decoding, so sbd-verify gives NTP's tokens of the same weights even where two tokens
nearly tie (tests/test_quantized.py, on CPU; on CUDA the same tests say whether its kernels are too). Float32
matrix products are not row-invariant; there, equal tokens rest on the rounding being far smaller than the
logits' gaps.

int4 needs the output size to be a multiple of 16 and the input size of the group; a layer that is not
(e.g. an output layer of 49,153 rows) takes int8. Every input size must be a multiple of 16 on a CPU
(torch's int8 kernel ends the process on others: `quantize` refuses such a model in one line). The output
layer is always int8: its rows are the vocabulary, and a drafting model's added mask token rarely leaves it
a multiple of 16.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import SBDError
from . import extension

FORMATS = ("int8", "int4")
DEVICES = ("cpu", "cuda")  # where torch has weight-only kernels (CUDA's int8 serves the output layer of int4 only)
GROUP = 32  # int4 values per scale (a GGUF Q4_1 block holds 32)
INT4_ROWS = 16  # the int4 kernel packs output rows by 16
INT8_INPUTS = 16  # the CPU int8 kernels take input sizes in steps of 16 (torch 2.13's crashes on others)
CPU_INT4_TILE = 64  # the CPU int4 kernel packs output rows in tiles of 64: layers join only at their borders
CUDA_K_TILES = (8, 4, 2)  # tinygemm's inner k tiles (16 input columns each), largest that divides the input first


class QuantizedLinear(nn.Module):
    """A linear layer whose weight is int8 or int4, in the forms of the kernel it runs on (`sbd_kernel`: sbd's
    products, groups of 32 inputs with float16 numbers; else torch's: int8 per output row, int4 in groups of
    `group` as (q - 8)·scale + zero)."""

    sbd_kernel = False  # on sbd's own products (made on a CPU where sbd's extension is built; in their forms)

    def __init__(self, in_features: int, out_features: int, fmt: str, group: int = GROUP):
        super().__init__()
        self.in_features, self.out_features, self.fmt, self.group = in_features, out_features, fmt, group
        self.register_parameter("bias", None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str, group: int = GROUP, sbd: bool = False) -> "QuantizedLinear":
        """The layer quantized; sbd: on sbd's own products where they take it (`sbd_products`: then in their
        formats, `sbd_groups`)."""
        w = linear.weight.detach().float()
        n, k = w.shape
        if fmt == "int4" and (n % INT4_ROWS or k % group or (w.is_cuda and k % (16 * CUDA_K_TILES[-1]))):
            fmt = "int8"
        if sbd and _sbd_takes(fmt, k, group, w.device):
            return cls.on_sbd(fmt, *sbd_groups(w, fmt), bias=linear.bias)
        q = cls(k, n, fmt, group)
        if fmt == "int8":
            scale = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / 127
            q.register_buffer("qweight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
            q.register_buffer("scales", scale.to(torch.bfloat16))
        else:
            g = w.reshape(n, k // group, group)
            lo, hi = g.amin(-1), g.amax(-1)
            scale = ((hi - lo) / 15).clamp_min(torch.finfo(torch.float32).tiny)
            values = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
            # w = (q - 8)·scale + zero with zero = lo + 8·scale, laid out (K/group, N, 2)
            scale_zero = torch.stack([scale, lo + 8 * scale], -1)
            q.register_buffer("qweight", _pack_int4(values.reshape(n, k)))
            q.register_buffer("scale_zero", scale_zero.transpose(0, 1).contiguous().to(torch.bfloat16))
        if linear.bias is not None:
            q.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        return q

    @classmethod
    def on_sbd(cls, fmt: str, values: torch.Tensor, numbers: torch.Tensor, bias: torch.Tensor | None = None,
               tail: torch.Tensor | None = None) -> "QuantizedLinear":
        """A layer on sbd's products from `sbd_groups`' values and float16 numbers; tail: float32 output rows
        after the int8 ones (int8 only: an output layer's rows int8 cannot hold exactly)."""
        n, k = values.shape
        q = cls(k, n + (0 if tail is None else len(tail)), fmt, GROUP)
        q.sbd_kernel = True
        if fmt == "int8":
            q.register_buffer("qweight", values.to(torch.int8).contiguous())
            q.register_buffer("scales", numbers.contiguous())
            if tail is not None:
                q.register_buffer("tail", tail.detach().float().contiguous())
        else:
            q.register_buffer("qweight", _SBD[0].int4_pack(values))
            q.register_buffer("scale_min", numbers.contiguous())
        if bias is not None:
            q.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        return q

    @property
    def kernel_scales(self) -> torch.Tensor:
        """The numbers beside the int values, as this layer's kernel takes them."""
        return self.scales if self.fmt == "int8" else self.scale_min if self.sbd_kernel else self.scale_zero

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows of the weight, dequantized (float32), at `index` (any shape): the sampler head reads the
        output layer's rows of its candidate tokens. int8 only (an output layer is always int8)."""
        if self.fmt != "int8":
            raise NotImplementedError("rows of an int4 layer are packed for its kernel")
        if not self.sbd_kernel:
            return self.qweight[index].float() * self.scales[index].float()[..., None]
        n = len(self.qweight)
        at = index.clamp_max(n - 1)
        got = int8_weights(self.qweight[at], self.scales[at])
        tail = self._buffers.get("tail")
        if tail is not None:
            got = torch.where((index >= n)[..., None], tail[(index - n).clamp_min(0)], got)
        return got

    def product(self, flat: torch.Tensor) -> torch.Tensor:
        """The kernel's product for rows (N, in) as it takes them (`takes_bfloat16`): (N, out) in their dtype,
        without the bias."""
        return self.bound_product()(flat)

    def bound_product(self):
        """`product` with this layer's tensors bound: a decoding step calls it ~200 times, and a module's
        attribute lookups would cost as much as the small products themselves."""
        qweight, scales = self.qweight, self.kernel_scales
        if self.sbd_kernel:  # in sbd's formats: no other kernel reads them
            if qweight.device.type != "cpu":
                raise SBDError(f"{self.fmt} weights made on a CPU are in sbd's CPU formats and cannot run on "
                               f"{qweight.device.type}: load the model there with weights=\"{self.fmt}\" instead")
            if self.fmt == "int8":
                int8, tail = _SBD[0].int8_mm, self._buffers.get("tail")
                return lambda flat: int8(flat, qweight, scales, tail)
            int4 = _SBD[0].int4_mm
            return lambda flat: int4(flat, qweight, scales)
        if self.fmt == "int8":
            return lambda flat: torch._weight_int8pack_mm(flat, qweight, scales)
        group = self.group
        mm = torch._weight_int4pack_mm if qweight.is_cuda else torch._weight_int4pack_mm_for_cpu
        return lambda flat: mm(flat, qweight, group, scales)

    @property
    def takes_bfloat16(self) -> bool:
        """Whether the kernel takes its input in bfloat16 (torch's; sbd's products take float32 as it is)."""
        return not (self.sbd_kernel and self.qweight.device.type == "cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        y = self.product(flat.to(torch.bfloat16) if self.takes_bfloat16 else flat).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt}" + (
            f", group={self.group}" if self.fmt == "int4" else "")


def joint_product(layers: tuple[QuantizedLinear, ...]):
    """One kernel call for quantized layers that read the same input (a Llama layer's q, k and v; its gate and
    up): a function of the bfloat16 input giving the layers' products side by side (without biases), or None
    where they cannot share one (different formats, groups or input sizes; int4 layers whose outputs are not
    whole tiles of the kernel's packing, 64 rows; not on a CPU).

    Why: at batch 1 every kernel call costs its fixed overhead (threads started and joined, the input cut
    into tiles) on top of reading its weights; joining SmolLM2's 7 products per layer into 4 saves 90 calls a
    forward. Exact: the CPU kernels compute each output column alone, so a column of the joint product is bit
    for bit the layer's own (tests/test_llama_forward.py compares every logit with transformers' modules).
    CUDA's int4 packs weights in tiles whose joining is not checked on a GPU yet: there each layer keeps its
    own call.

    Memory: each layer's weight becomes a view of its rows of the joint one (no copy); int4 scales are held
    twice (the kernel takes them contiguous, column-major per group: 1 bit per weight of these layers). Kept
    on the first layer and rebuilt when any layer's tensors change (moved, re-quantized)."""
    first = layers[0]
    if any(not isinstance(q, QuantizedLinear) or (q.fmt, q.group, q.in_features, q.sbd_kernel) != (
           first.fmt, first.group, first.in_features, first.sbd_kernel) or q.qweight.device.type != "cpu"
           or (q.fmt == "int4" and not q.sbd_kernel and q.out_features % CPU_INT4_TILE) or "tail" in q._buffers
           for q in layers):
        return None
    tensors = [t for q in layers for t in q._buffers.values()]
    cached = first.__dict__.get("_joint")  # (the layers' tensors it was built from, the product)
    if cached is not None and len(cached[0]) == len(tensors) and all(a is b for a, b in zip(cached[0], tensors)):
        return cached[1]
    weight = torch.cat([q.qweight for q in layers])
    by_row = "scales" if first.fmt == "int8" else "scale_min" if first.sbd_kernel else None  # scales per output row
    scales = torch.cat([getattr(q, by_row) for q in layers]) if by_row else None
    at = 0
    for q in layers:  # each layer's tensors become views of its rows of the joint ones
        q.qweight = weight[at : at + q.out_features]
        if by_row:
            setattr(q, by_row, scales[at : at + q.out_features])
        at += q.out_features
    if by_row is None:  # torch's int4 layout: scales per group, then per output row
        scales = torch.cat([q.scale_zero for q in layers], 1).contiguous()
    product = JointProduct(first.fmt, weight, scales, first.group, first.sbd_kernel)
    first.__dict__["_joint"] = ([t for q in layers for t in q._buffers.values()], product)
    return product


class JointProduct:
    """`joint_product`'s product: the joint weights with their kernel (a callable of the input as the kernel
    takes it, `QuantizedLinear.takes_bfloat16`); sbd's native decoder layers read the tensors themselves
    (`sbd.decoding.native_layers`)."""

    def __init__(self, fmt: str, weight: torch.Tensor, scales: torch.Tensor, group: int, sbd_kernel: bool = False):
        self.fmt, self.weight, self.scales, self.group, self.sbd_kernel = fmt, weight, scales, group, sbd_kernel
        if sbd_kernel:  # the kernel bound once: the Python layers call this per forward
            mm = _SBD[0].int8_mm if fmt == "int8" else _SBD[0].int4_mm
            self._product = lambda flat: mm(flat, weight, scales)
        elif fmt == "int8":
            self._product = lambda flat: torch._weight_int8pack_mm(flat, weight, scales)
        else:
            self._product = lambda flat: torch._weight_int4pack_mm_for_cpu(flat, weight, group, scales)

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        return self._product(flat)


_SBD: list = []  # sbd's compiled products, once loaded: kept for the process (the layers that chose them need them)


def sbd_groups(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """float weights (N, K) in sbd's formats, groups of 32 inputs per output row with float16 numbers (GGUF's
    own forms): int8 (values (N, K) in -127..127, d (N, K/32)), w = q·d; int4 (values (N, K) in 0..15,
    (d, m) (N, K/32, 2)), w = q·d + m. From weights that came from a Q8_0 or Q4_1 file these give back the
    file's numbers, and `int8_weights`/`int4_weights` the weights bit for bit (`sbd.models.lossless`)."""
    n, k = w.shape
    g = w.float().reshape(n, k // GROUP, GROUP)
    if fmt == "int8":
        d = (g.abs().amax(-1) / 127).to(torch.float16)
        numbers, offset, lowest, highest = d, 0, -127, 127
    else:
        lo, hi = g.amin(-1), g.amax(-1)
        d, m = ((hi - lo) / 15).to(torch.float16), lo.to(torch.float16)
        numbers, offset, lowest, highest = torch.stack([d, m], -1), m.float()[..., None], 0, 15
    step = d.float()[..., None]  # a group whose step is 0 holds one value: every q is 0
    values = torch.where(step > 0, torch.round((g - offset) / step.clamp_min(torch.finfo(torch.float32).tiny)), 0)
    values = values.clamp(lowest, highest)
    if not torch.isfinite(numbers).all():
        raise SBDError(f"weights of magnitude {w.abs().max().item():.3g} are beyond float16's range: {fmt} cannot hold "
                       "them; load the model without weights=")
    return values.reshape(n, k).to(torch.int8 if fmt == "int8" else torch.uint8), numbers


def int8_weights(values: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """sbd's int8 weights (…, K) with their float16 scales (…, K/32) as float32: q·d, exact."""
    shape = values.shape
    return (values.float().reshape(*shape[:-1], -1, GROUP) * d.float()[..., None]).reshape(shape)


def int4_weights(values: torch.Tensor, dm: torch.Tensor) -> torch.Tensor:
    """sbd's int4 values (N, K) (unpacked, 0..15) with their float16 (d, m) (N, K/32, 2) as float32: q·d + m,
    rounded once (q·d is exact in float32), as sbd's product forms them."""
    n, k = values.shape
    q = values.float().reshape(n, k // GROUP, GROUP)
    return (q * dm[..., 0].float()[..., None] + dm[..., 1].float()[..., None]).reshape(n, k)


def sbd_products() -> bool:
    """Whether sbd's own products run here (sbd's extension built now, once per machine; where it cannot be,
    one line says so and torch's kernels run). Read once per layer when `quantize` makes it."""
    if not extension.wanted():
        return False
    if not _SBD:
        module = extension.prepare("cpu")
        if module is None:
            return False
        _SBD.append(module)
    return True


def _sbd_takes(fmt: str, in_features: int, group: int, device: torch.device) -> bool:
    """Whether sbd's products take a layer of this format and input size (on a CPU, in groups of 32 inputs)."""
    if device.type != "cpu" or in_features % GROUP or group != GROUP:
        return False
    return sbd_products()


def _pack_int4(values: torch.Tensor) -> torch.Tensor:
    """int4 values (int32 [N, K], 0..15) in the layout of the device's kernel: the CPU's from int32, CUDA's
    tinygemm from two values per byte, even columns in the high nibble (checked on an H200, torch 2.11), with
    the widest inner k tiles that fit."""
    if not values.is_cuda:
        return torch._convert_weight_to_int4pack_for_cpu(values, 1)
    k = values.shape[1]
    tiles = next(t for t in CUDA_K_TILES if k % (16 * t) == 0)
    return torch._convert_weight_to_int4pack((values[:, ::2] << 4 | values[:, 1::2]).to(torch.uint8), tiles)


def check_kernels(device: torch.device | str = "cpu") -> None:
    """SBDError in one line when this torch lacks the kernels (private ops) on `device` or they compute wrong."""
    device = torch.device(device)
    try:
        # weights on the int4 grid (every group spans its 16 levels, steps of 1/16): int4 holds them exactly
        # and int8 within half a step, so a right kernel is off by rounding only and a wrong one by far more
        seeded = torch.Generator().manual_seed(0)
        x = torch.randn(2, 128, generator=seeded).to(device)
        levels = torch.randint(0, 16, (16, 128), generator=seeded)
        levels[:, ::GROUP], levels[:, 1::GROUP] = 0, 15
        lin = nn.Linear(128, 16, bias=False, device=device)
        with torch.no_grad():
            lin.weight.copy_((levels - 8).float() / 16)
        want = x @ lin.weight.t()
        for fmt in FORMATS:
            got = QuantizedLinear.from_linear(lin, fmt)(x)
            if (got - want).norm() > 0.02 * want.norm():
                raise RuntimeError(f"{fmt} products are off by {(got - want).abs().max():.3g}")
    except (AttributeError, RuntimeError, NotImplementedError) as err:
        raise SBDError(f"quantized weights need torch's weight-only int8/int4 {device.type.upper()} kernels, which "
                       f"torch {torch.__version__} does not run here ({str(err).splitlines()[0][:120]}); load the model "
                       f"without weights=\"int8\"/\"int4\"") from None


def quantize(model, fmt: str, group: int = GROUP) -> dict[str, str]:
    """Replace `model`'s linear layers (the output layer with int8; a drafter's stay float) in place by
    quantized ones; returns {layer name: format}. Forward hooks on a layer (a drafting adapter's) stay attached: each module keeps
    its identity and takes the quantized class. On a CPU or a CUDA GPU (torch's kernels for each)."""
    if fmt not in FORMATS:
        raise SBDError(f"weights={fmt!r}: quantized formats are {', '.join(FORMATS)}")
    device = model.get_input_embeddings().weight.device
    if device.type not in DEVICES:
        raise SBDError(f"weights={fmt!r} runs on {' and '.join(DEVICES)} only (the model is on {device.type})")
    if device.type == "cuda" and fmt == "int8":  # a slow path must not be a silent one
        raise SBDError("weights='int8' on CUDA: torch's int8 weight-only kernel ran 2.8-9x slower than bfloat16 "
                       "per layer on an H200 (benchmarks/results/gpu_h200_2026-11-28); use weights='int4' or the "
                       "bfloat16 weights")
    check_kernels(device)
    head = model.get_output_embeddings()
    linears = _base_linears(model)
    odd = next((name for name, m in linears if m.in_features % INT8_INPUTS), None)
    if device.type == "cpu" and odd is not None:  # torch's CPU int8 kernel crashes the process on these
        raise SBDError(f"weights={fmt!r}: {odd} takes {dict(linears)[odd].in_features} inputs; the CPU int8 kernels "
                       f"need a multiple of {INT8_INPUTS}; load the model without weights=")
    done = {}
    for name, module in linears:
        done[name] = replace(module, QuantizedLinear.from_linear(module, "int8" if module is head else fmt, group,
                                                                  sbd=True))
    model.config.sbd_weights, model.config.sbd_weights_exact = fmt, False
    return done


def replace(module: nn.Linear, q: QuantizedLinear) -> str:
    """`module` becomes `q` in place (the same object: its hooks and every reference to it stay); its format."""
    module.__class__ = QuantizedLinear
    module._parameters, module._buffers = q._parameters, q._buffers  # int values, scales, bias
    module.fmt, module.group, module.sbd_kernel = q.fmt, q.group, q.sbd_kernel
    module.in_features, module.out_features = q.in_features, q.out_features
    return q.fmt


def weights_format(model) -> str | None:
    """"int8"/"int4" when `quantize` made every linear layer of `model` quantized, else None."""
    fmt = getattr(getattr(model, "config", None), "sbd_weights", None)  # a saved config may say so of float layers
    return fmt if fmt in FORMATS and not _base_linears(model) else None


def held_weights(model, fmt=...) -> str:
    """What a user is told of a loaded model's linear layers: their format ("int4, exactly as stored" where
    `sbd.models.lossless` held a file's own int4/int8 numbers), else their dtype. fmt: `weights_format(model)`
    where the caller has it."""
    if fmt is ...:
        fmt = weights_format(model)
    exact = getattr(getattr(model, "config", None), "sbd_weights_exact", False)
    if fmt:
        return f"{fmt}, exactly as stored" if exact else fmt
    held = sum(isinstance(m, QuantizedLinear) for m in model.modules())
    dtype = getattr(model, "dtype", None) or next((p.dtype for p in model.parameters()), "no weights")
    dtype = str(dtype).replace("torch.", "")
    return f"{held} layers int4/int8 exactly as stored, the rest {dtype}" if held else dtype


def _base_linears(model) -> list[tuple[str, nn.Linear]]:
    """The base model's float linear layers (a drafter's own layers are not the base model's)."""
    from ..drafters.adapter import adapter_of
    from ..drafters.sampler_head import head_of

    drafters = {id(m) for d in (adapter_of(model), head_of(model)) if d is not None for m in d.modules()}
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and id(m) not in drafters]


def row_invariant(model) -> bool:
    """Whether each row of every linear layer's product is bitwise the same whatever the other rows (the
    quantized kernels): then a forward may compute its committed positions as NTP's one-token forwards do."""
    return weights_format(model) is not None
