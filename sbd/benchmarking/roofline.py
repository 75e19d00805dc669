"""A roofline model of one decoding forward, and the paper's printed version of it.

Every kernel of a forward takes max(bytes moved / memory bandwidth, FLOPs / peak FLOP/s) and the
forward is their sum (the paper's eq. 15, applied per kernel as its Figure 11 does). At small batch a
decoding forward is bound by reading the weights, which costs the same for 1 or 16 new tokens — the
argument behind "fewer forwards = less time". `forward_cost.forward_cost_table` measures the same
ratio on a real model; `sbd roofline` prints both.

Two versions:
- `forward_time(shape, hw, …)`: a whole model (every layer, q/k/v/o, gate/up/down, the output layer),
  the new tokens counted in the attention length.
- `paper_forward_time(…)`: the code printed in the paper (Figures 6 and 11) line for line, quirks
  included, so that its Tables 3 and 4 can be reproduced (see `PAPER_QUIRKS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SBDError


@dataclass(frozen=True)
class Hardware:
    name: str
    flops: float  # peak dense FLOP/s of the linear layers' dtype
    attention_flops: float  # peak dense FLOP/s of the attention kernel's dtype
    bandwidth: float  # memory bytes/s


@dataclass(frozen=True)
class ModelShape:
    """What a forward's cost depends on. Bytes per weight / cached value / activation set the dtypes."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    weight_bytes: float = 2.0
    kv_bytes: float = 2.0
    act_bytes: float = 2.0

    @classmethod
    def from_config(cls, config, weight_bytes: float = 2.0, kv_bytes: float = 2.0, name: str = "model"):
        cfg = config.get_text_config(decoder=True)
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cls(name, cfg.num_hidden_layers, cfg.hidden_size, heads, getattr(cfg, "num_key_value_heads", heads),
                   head_dim, cfg.intermediate_size, cfg.vocab_size, weight_bytes, kv_bytes, weight_bytes)


    @property
    def weight_count(self) -> int:
        """Weights a forward multiplies by: every layer's q, k, v, o, gate, up, down, and the output layer."""
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = self.hidden * (2 * q_dim + 2 * kv_dim) + 3 * self.hidden * self.intermediate
        return self.layers * layer + self.vocab * self.hidden


def gemm_time(hw: Hardware, m: int, n: int, k: int, weight_bytes: float, act_bytes: float) -> float:
    """C[m, n] = A[m, k] @ W[k, n]: read the activations and the weights, write the output."""
    io = m * k * act_bytes + k * n * weight_bytes + m * n * act_bytes
    return max(io / hw.bandwidth, 2.0 * m * n * k / hw.flops)


def attention_time(m: ModelShape, hw: Hardware, batch: int, width: int, cached: int) -> float:
    """One layer's fused attention: read Q, K and V of the whole context, write the output."""
    tokens, context = batch * width, cached + width
    io = (2 * tokens * m.heads * m.head_dim * m.act_bytes  # Q in, output out
          + 2 * batch * context * m.kv_heads * m.head_dim * m.kv_bytes)  # K and V
    flops = 4.0 * tokens * context * m.heads * m.head_dim  # QKᵀ and PV
    return max(io / hw.bandwidth, flops / hw.attention_flops)


def forward_time(m: ModelShape, hw: Hardware, batch: int, width: int, cached: int) -> float:
    """Seconds of one forward of `width` new tokens per row over `cached` cached tokens."""
    if batch < 1 or width < 1 or cached < 0:
        raise SBDError(f"impossible forward: batch {batch}, width {width}, cached {cached}")
    t = batch * width
    g = lambda n, k: gemm_time(hw, t, n, k, m.weight_bytes, m.act_bytes)  # noqa: E731
    q_dim, kv_dim = m.heads * m.head_dim, m.kv_heads * m.head_dim
    layer = (g(q_dim, m.hidden) + 2 * g(kv_dim, m.hidden) + g(m.hidden, q_dim)  # q, k, v, o
             + 2 * g(m.intermediate, m.hidden) + g(m.hidden, m.intermediate)  # gate, up, down
             + attention_time(m, hw, batch, width, cached))
    return m.layers * layer + g(m.vocab, m.hidden)  # + the output layer


def slowdown(m: ModelShape, hw: Hardware, batch: int, width: int, cached: int) -> float:
    """time(width) / time(1): what a `width`-token forward costs relative to one NTP step."""
    return forward_time(m, hw, batch, width, cached) / forward_time(m, hw, batch, 1, cached)


def block_speedup(time, k: int, nfe_speedup: float) -> float:
    """Eq. 16: wall-clock speedup of SBD over NTP for a block of k decoded in l = k / nfe_speedup
    forwards, `time(w)` the cost of a w-token forward: k·time(1) / (time(2k) + (l − 1)·time(k))."""
    forwards = k / nfe_speedup
    return k * time(1) / (time(2 * k) + (forwards - 1) * time(k))


# --- The paper's printed roofline (arXiv 2509.04185, Figures 6 and 11), line for line ---------------

PAPER_CONSTANTS = dict(
    BYTES=1,  # FP8 weights
    PEAK_FLOPS=1978 * 1e12,  # FP8
    PEAK_FLOPS_ATTENTION=989 * 1e12,  # attention in BF16
    MEMORY_BANDWIDTH=3.35 * (1024 ** 4),  # B/s
    HIDDEN_DIM=4096,
    FFN_DIM=4 * 4096,
    NUM_HEADS=32,
    HEAD_DIM=4096 // 32,
    NUM_KV_HEADS=8,
    BYTES_PER_KV_ELEMENT=1,
)

PAPER_QUIRKS = (
    "the FFN GEMMs take HIDDEN_DIM * FFN_DIM (67M) as a matrix dimension: 275 GB of 'weights' per FFN "
    "projection, which swamps every other cost (so the tables hardly move with the KV length)",
    "the K and V projections are NUM_HEADS * NUM_KV_HEADS (256) wide instead of NUM_KV_HEADS * HEAD_DIM (1024)",
    "FFN_DIM = 4 * HIDDEN_DIM = 16384 and no gate projection (Llama-3.1-8B: 14336, with a gate)",
    "the memory bandwidth is 3.35 * 1024**4 B/s (TiB/s) where the H100's 3.35 TB/s is 3.35e12",
    "one layer only, no output layer; attention at the BF16 peak with 1-byte tensors",
)


def _paper_gemm(c, m, n, k):
    io = m * k * c["BYTES"] + n * k * c["BYTES"] + m * n * c["BYTES"]
    flops = 2 * m * n * k
    return max(io / c["MEMORY_BANDWIDTH"], flops / c["PEAK_FLOPS"]), flops


def paper_forward_time(block_size: int, kv_length: int, batch_size: int, constants: dict = PAPER_CONSTANTS) -> float:
    """The paper's time(k): its fused-attention roofline plus its linear-layers roofline, as printed."""
    c = constants
    tokens = block_size * batch_size
    heads_dim = c["NUM_HEADS"] * c["HEAD_DIM"]
    bytes_q = tokens * heads_dim * c["BYTES"]
    bytes_k = batch_size * kv_length * c["NUM_KV_HEADS"] * c["HEAD_DIM"] * c["BYTES_PER_KV_ELEMENT"]
    _, flops_qk = _paper_gemm(c, tokens, kv_length, heads_dim)
    bytes_v = bytes_k
    _, flops_pv = _paper_gemm(c, tokens, kv_length, heads_dim)
    bytes_out = tokens * heads_dim * c["BYTES"]
    attention = max((bytes_q + bytes_k + bytes_v + bytes_out) / c["MEMORY_BANDWIDTH"],
                    (flops_qk + flops_pv) / c["PEAK_FLOPS_ATTENTION"])
    h, f = c["HIDDEN_DIM"], c["FFN_DIM"]
    linear = (_paper_gemm(c, tokens, h, h * f)[0]  # "FFN: Up-projection"
              + _paper_gemm(c, tokens, h * f, h)[0]  # "FFN: Down-projection"
              + _paper_gemm(c, tokens, h, heads_dim)[0]  # Q
              + 2 * _paper_gemm(c, tokens, h, c["NUM_HEADS"] * c["NUM_KV_HEADS"])[0]  # K, V
              + _paper_gemm(c, tokens, heads_dim, h)[0])  # out
    return attention + linear


def paper_slowdown(batch: int, width: int, kv_length: int) -> float:
    """A cell of the paper's Table 3: time(width) / time(1)."""
    return paper_forward_time(width, kv_length, batch) / paper_forward_time(1, kv_length, batch)


def paper_block_speedup(batch: int, k: int, kv_length: int, nfe_speedup: float) -> float:
    """A cell of the paper's Table 4."""
    return block_speedup(lambda w: paper_forward_time(w, kv_length, batch), k, nfe_speedup)
