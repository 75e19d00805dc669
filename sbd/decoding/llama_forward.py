"""The engine's own forward of Llama-family models: transformers' arithmetic without its overhead.

Why: at batch 1 on a CPU a decoding forward of a small model spends as much time around its kernels as
in them. A SmolLM2-135M step with int4 weights took 10.8 ms through transformers' modules, of which the
kernels (int4 and int8 products, attention) took ~4.3 ms; the rest was module calls, keyword plumbing,
a bfloat16 cast per quantized layer on the way in and a float32 cast on the way out, and the rotary
embedding rebuilt per layer. This forward runs the same operations on the same weights, in the same
order, and gives bit for bit transformers' logits (tests/test_llama_forward.py), in 7.5 ms. On a CPU its
attention, norms, activation and float32 linear layers run on sbd's own kernels where sbd's extension is
loaded (`sbd.decoding.own_kernels`: float32, row-invariant, faster); its logits then differ from transformers'
by rounding (`own_kernels.OWN = False` gives transformers' bits).

What it does differently, each exact:
- no nn.Module calls inside the decoder layers (the embedding and the output layer are still called as
  modules: the drafting adapter's mask embedding and the sampler head's capture hook on them run);
- quantized layers (`sbd.models.quantized`) that share an input (q, k, v; gate, up) take one copy of it
  (bfloat16 for torch's kernels; sbd's products take it as it is) and, on a CPU, one kernel call
  (`joint_product`: each output column is computed alone, so the columns are the layers' own bit for bit);
  torch's bfloat16 outputs are not widened: the float32 operation that reads them (rotary, residual add,
  the activation's product) widens them exactly as a cast would;
- the rotary embedding's cos/sin are laid out once per forward, and its half rotation is a `roll` of the
  halves times a sine whose first half is negated: (−x₂)·s = x₂·(−s) in floating point;
- the drafting adapter's gated update is added by the same function its hooks call (`gate_output`), only
  on the layers it targets and only in forwards that carry a block.

On a CPU the decoder layers run from C++ (`sbd.decoding.native_layers`): the very operations below, in the
same order, bit for bit, without the Python between them (SmolLM2 on a 2-core Xeon: int4 +28–31% tokens/s,
float32 +14%).

Models: transformers' Llama, Mistral and Qwen2 (biases included) on routed attention
(`sbd.decoding.attention`), without an active sliding window. Anything else, or a model with forward
hooks of its own on the decoder layers, runs through transformers (`ModelForward.lean` says which).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..drafters.adapter import adapter_of, gate_output, layer_keys
from ..models.quantized import QuantizedLinear, joint_product
from . import native_layers, own_kernels
from .attention import OWN_PLANS, StepLayout, attend, query_ends, supports

FAMILIES = ("llama", "mistral", "qwen2")


@dataclass
class StepOutput:
    logits: torch.Tensor


def supported(model) -> str | None:
    """None when `LlamaForward` can run `model`, else why not (a short phrase)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"its architecture is {kind!r}, not one of {', '.join(FAMILIES)}"
    if (getattr(config, "pretraining_tp", 1) or 1) > 1:
        return "it splits its linear layers (pretraining_tp > 1)"
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings:
        return "it attends through a sliding window"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "norm"):
        return "its modules are not laid out as transformers' Llama"
    for layer in layers:
        a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if any(not hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling", "head_dim")) or \
                any(not hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return "its modules are not laid out as transformers' Llama"
    return None


def runs_natively(model) -> bool:
    """Whether sbd's eager forward of `model` runs its decoder layers from C++: this forward on routed
    attention, with layers the native extension takes (`native_layers.takes`). `DecodeSpec` refuses
    compile=True then: the compiled step is the slower one."""
    return supports(model) and supported(model) is None and native_layers.takes(model)


def _norm(module) -> tuple[torch.Tensor, float]:
    return module.weight, module.variance_epsilon


def _rms_norm(norm: tuple[torch.Tensor, float], x: torch.Tensor) -> torch.Tensor:
    """transformers' Llama RMSNorm, op for op; norm: (weight, epsilon)."""
    weight, eps = norm
    if x.dtype == torch.float32:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _linear_entry(lin, key: str | None, adapter, own) -> tuple:
    """(product, quantized, bias, adapter key, (Aᵀ, Bᵀ) of the adapter's update or None): a quantized
    layer's kernel with its tensors bound, and the input it takes ("bfloat16" torch's kernels, "as is" sbd's
    products), else a float layer's forward (on sbd's float32 product where `own` serves it:
    `own_kernels.FloatProduct`, whose bias is then given for a joint product's columns) and False."""
    update = (adapter.lora_A[key].t(), adapter.lora_B[key].t()) if key is not None else None
    if isinstance(lin, QuantizedLinear):
        return lin.bound_product(), "bfloat16" if lin.takes_bfloat16 else "as is", lin.bias, key, update
    if own_kernels.takes_float(own, (lin,)):
        return own_kernels.FloatProduct(own, (lin,)).forward, False, lin.bias, key, update
    return lin.forward, False, None, key, update


def _float_joint(own, layers):
    """sbd's float32 product of float layers sharing an input, in one call, or None (`own_kernels`)."""
    return own_kernels.FloatProduct(own, layers) if own_kernels.takes_float(own, layers) else None


def _joint(product, xq: torch.Tensor | None, sizes: tuple[int, ...]) -> tuple:
    """The columns of each layer in one joint product of layers sharing an input (`joint_product`), or a
    None per layer when they have none (each layer then computes its own)."""
    if product is None:
        return (None,) * len(sizes)
    return product(xq).split(sizes, -1)


class LlamaForward:
    """One decoding forward of a Llama-family model over the engine's cache (see the module docstring)."""

    def __init__(self, model):
        self.model = model
        self.inner = model.model
        self.adapter = adapter_of(model)
        self._keys = keys = layer_keys(self.adapter, model) if self.adapter is not None else {}
        self.own = own = own_kernels.chosen(model)  # sbd's kernels for every forward of this engine, or None
        self.layers = []  # per layer, what a step reads, bound once (module attribute lookups cost per call)
        for layer in self.inner.layers:
            a, m = layer.self_attn, layer.mlp
            lins = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
            joint = (joint_product(lins[:3]) or _float_joint(own, lins[:3]),  # before the layers' own are bound
                     joint_product(lins[4:6]) or _float_joint(own, lins[4:6]))
            self.layers.append((_norm(layer.input_layernorm), _norm(layer.post_attention_layernorm), a.head_dim,
                                a.scaling, m.act_fn.forward,
                                tuple(_linear_entry(lin, keys.get(id(lin)), self.adapter, own) for lin in lins), joint,
                                (a.q_proj.out_features, a.k_proj.out_features, a.v_proj.out_features),
                                (m.gate_proj.out_features, m.up_proj.out_features)))
        self.final_norm = _norm(self.inner.norm)
        head = model.get_output_embeddings()
        self.head = _float_joint(own, (head,))  # the output layer on sbd's float32 product, or None
        # every linear layer row-invariant in forwards of up to FLOAT_ROWS positions (sbd's float32 product; the
        # quantized layers are at any width): the engine may then take the "exact" attention plan
        self.float_invariant = self.head is not None and all(
            getattr(entry[0], "__func__", None) is own_kernels.FloatProduct.forward
            for layer in self.layers for entry in layer[5])
        self.native = native_layers.bind(self)  # the decoder layers from C++ where they can run (else None)

    def foreign_hooks(self) -> bool:
        """Whether a decoder layer's module carries forward hooks other than the drafting adapter's (this
        forward would bypass them: then transformers runs the model). Read when an engine starts."""
        for layer in self.inner.layers:
            for mod in layer.modules():
                if len(mod._forward_pre_hooks) or len(mod._forward_hooks) > (id(mod) in self._keys):
                    return True
        return False

    def __call__(self, tokens: torch.Tensor, pos: torch.Tensor, cache, layout: StepLayout,
                 logits_to_keep: int) -> StepOutput:
        B, W = tokens.shape
        h = self.inner.embed_tokens(tokens)
        cos, sin = self.inner.rotary_emb(h, pos)
        half = cos.shape[-1] // 2
        cos, sin = cos[:, None], torch.cat([-sin[..., :half], sin[..., half:]], -1)[:, None]
        start = self.adapter.start if self.adapter is not None else None
        gated = start is not None and (isinstance(start, torch.Tensor) or start < W)  # a block in this forward
        # one row, one start: the gated rows of each input are a slice, taken once for the layers sharing it
        rows = (gated and B == 1 and isinstance(start, int) and not torch.is_grad_enabled()
                and self.adapter.mask_embedding.dtype == h.dtype)
        own = self.own if not torch.is_grad_enabled() else None  # (no gradients through them)
        ends = query_ends(layout, B, W) if own is not None and layout.plan in OWN_PLANS else None
        norm = (lambda n, x: own.norm(x, *n)) if own is not None else _rms_norm
        gate_form = self._gate_form(B, W, start, gated, rows, h) if self.native is not None else None
        if gate_form is not None:
            done = self.native(h, cos, sin, cache, layout, *gate_form, own is not None, ends)
            if done is not None:
                return self._head(done, logits_to_keep, norm)
        gate = (lambda x: x.view(-1, x.shape[-1])[start:]) if rows else (lambda x: True) if gated else (lambda x: None)
        for i, (norm1, norm2, hd, scaling, act, (q, k, v, o, gate_p, up, down), (qkv, gu), qkv_sizes,
                gu_sizes) in enumerate(self.layers):
            x = norm(norm1, h)
            xq, g = self._kernel_input(x, q), gate(x)
            jq = self._joint_input(qkv, x, xq, B * W)
            if jq is not None:  # q and k rotated together: the same elementwise operations on both
                qk, vs = self._qkv(qkv, (q, k, v), qkv_sizes, x, jq, g, hd, h.dtype)
                qk = qk * cos + qk.roll(half, -1) * sin
                qs, ks = qk[:, : qkv_sizes[0] // hd], qk[:, qkv_sizes[0] // hd :]
            else:
                # a quantized layer's bfloat16 output widened once (the rotation's two products would each widen it)
                qs = self._linear(q, x, xq, g).view(B, W, -1, hd).transpose(1, 2).to(h.dtype)
                ks = self._linear(k, x, xq, g).view(B, W, -1, hd).transpose(1, 2).to(h.dtype)
                vs = self._linear(v, x, xq, g).view(B, W, -1, hd).transpose(1, 2).to(h.dtype)
                qs = qs * cos + qs.roll(half, -1) * sin
                ks = ks * cos + ks.roll(half, -1) * sin
            ks, vs = cache.layers[i].update(ks, vs)
            att = attend(qs, ks, vs, layout, scaling, own, ends).transpose(1, 2).reshape(B, W, -1)
            h = h + self._linear(o, att, self._kernel_input(att, o), gate(att))
            x = norm(norm2, h)
            xq, g = self._kernel_input(x, gate_p), gate(x)
            jg = self._joint_input(gu, x, xq, B * W)
            yg, yu = _joint(gu if jg is not None else None, jg, gu_sizes)
            if own is not None:
                mid = own.silu_mul(self._linear(gate_p, x, xq, g, yg).to(h.dtype),
                                   self._linear(up, x, xq, g, yu).to(h.dtype))
            else:
                mid = act(self._linear(gate_p, x, xq, g, yg).to(h.dtype)) * self._linear(up, x, xq, g, yu)
            h = h + self._linear(down, mid, self._kernel_input(mid, down), gate(mid))
        return self._head(h, logits_to_keep, norm)

    def _gate_form(self, B: int, W: int, start, gated: bool, rows: bool, h: torch.Tensor) -> tuple | None:
        """How the native layers apply the adapter's gate in this forward, as the Python layers would:
        (mode, start, per-row gate, scale), mode 0 no block, 1 one row's block (`rows`), 2 every row's block
        from one column (`gated_update`'s in-place form, rows > 1), 3 a block per row (its per-row form);
        None where only the Python layers do it as they do (other dtypes, gradients)."""
        if not gated:
            return 0, -1, None, 1.0
        scale = self.adapter.scaling
        if rows:
            return 1, start, None, scale
        if isinstance(start, torch.Tensor):
            return 3, -1, (torch.arange(W, device=h.device)[None] >= start[:, None]).to(h.dtype)[..., None], scale
        same = next(iter(self.adapter.lora_A.values())).dtype == h.dtype
        return (2, start, None, scale) if B > 1 and same and not torch.is_grad_enabled() else None

    def _head(self, h: torch.Tensor, logits_to_keep: int, norm=_rms_norm) -> StepOutput:
        h = norm(self.final_norm, h[:, -logits_to_keep:])
        return StepOutput(own_kernels.head_logits(self.head, self.model.get_output_embeddings(), h))

    def _qkv(self, product, entries, sizes: tuple[int, int, int], x: torch.Tensor, xq: torch.Tensor, gate,
             hd: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k side by side (B, heads of q and k, W, hd), and v (B, heads, W, hd), from one joint product
        (`joint_product`) widened once: each layer's columns with its bias and the adapter's update added in
        place, the operations `_linear` applies to a layer's own output, in the same order."""
        B, W = x.shape[:2]
        y = product(xq).to(dtype)
        for (_, _, bias, key, update), part in zip(entries, y.split(sizes, -1)):
            if bias is not None:
                part.add_(bias)
            if gate is None or key is None:
                continue
            if gate is True:
                part.view(B, W, -1).copy_(gate_output(self.adapter, key, x, part.view(B, W, -1)))
            else:
                part[-gate.shape[0]:].addmm_(torch.mm(gate, update[0]), update[1], alpha=self.adapter.scaling)
        qk = y[:, : sizes[0] + sizes[1]].view(B, W, -1, hd).transpose(1, 2)
        return qk, y[:, sizes[0] + sizes[1] :].view(B, W, -1, hd).transpose(1, 2)

    @staticmethod
    def _joint_input(joint, x: torch.Tensor, xq: torch.Tensor | None, rows: int) -> torch.Tensor | None:
        """What a joint product of layers sharing x takes (a quantized one's kernel input; x's rows for sbd's
        float32 one), or None where it does not run in this forward (none; a float one past its width)."""
        if joint is None or xq is not None:
            return None if joint is None else xq
        return x.reshape(rows, x.shape[-1]) if joint.runs(rows) else None

    @staticmethod
    def _kernel_input(x: torch.Tensor, entry) -> torch.Tensor | None:
        """The input of a quantized layer as its kernel takes it, once for the layers that share it: bfloat16
        for torch's kernels, as it is for sbd's products; None for a float layer."""
        if not entry[1]:
            return None
        flat = x.reshape(-1, x.shape[-1])
        return flat.to(torch.bfloat16) if entry[1] == "bfloat16" else flat

    def _linear(self, entry, x: torch.Tensor, xq: torch.Tensor | None, gate,
                joint: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output for x (B, W, in): a quantized layer's in its kernel's dtype (torch's: bfloat16)
        unless the adapter adds to it.
        gate: None (no block in this forward), x's gated rows (one row, one start: the hook's own
        arithmetic on them, `gated_update`'s decoding path) or True (any other gate: `gate_output`);
        joint: the layer's columns of a joint product (`_joint`), computed already."""
        product, quantized, bias, key, update = entry
        if quantized or joint is not None:
            y = (product(xq) if joint is None else joint).view(*x.shape[:-1], -1)
            if bias is not None:
                y = y + bias  # widened to the bias' dtype, as a cast before the add would
        else:
            y = product(x)
        if gate is None or key is None:
            return y
        y = y.to(x.dtype)
        if gate is True:
            return gate_output(self.adapter, key, x, y)
        a_t, b_t = update
        y.view(-1, y.shape[-1])[-gate.shape[0]:].addmm_(torch.mm(gate, a_t), b_t, alpha=self.adapter.scaling)
        return y
