"""The sampler head: a small drafting module that lets the drafts of one block see each other.

The masks of sbd-verify draft every block position independently: position i cannot know which token
was drafted at i − 1, so a draft like "New York" vs "Los Angeles" can come out as "New Angeles". The
sampler head (after Apple's "Your LLM Knows the Future", arXiv 2507.11851) corrects this cheaply: it
nudges the masked hidden state h_i (the input of the output layer, after the final norm) by a small
residual MLP of h_i and the embedding of the token at i − 1,

    h'_i = h_i + W2 · silu(W1 · [h_i ; E(t_{i−1})]),      logits'_i = lm_head(h'_i),

with E the model's own (frozen) input embedding and a low inner width. W2 starts at zero, so an
untrained head changes nothing. A head made with `state=True` also carries its own inner activation
from one draft position to the next (EAGLE's "feature + shifted token"):

    a_i = silu(W1 · [h_i ; E(t_{i−1})] + U · a_{i−1}),      h'_i = h_i + W2 · a_i,

with a before the first draft position zero and U starting at zero (`add_state` turns a trained head
into a stateful one that drafts exactly as before), so position i can read the whole chain drafted
before it, not only its last token. It acts on drafts only, never on the next-token head, so sbd-verify's
output stays the model's own.

Decoding (greedy) rescores only the masks' top-K candidates per position, left to right: position i's
previous token is the head's own pick at i − 1 (for the first draft position, the next-token head's
token before it). `draft_table` computes, on the device and in one batch, the best candidate at every
position for every possible previous candidate; the row walks that table on the host (`walk`), so the
sequential choice costs no extra device round trip. A stateful head's table is built along its own
greedy chain (position i's state is the one the chain reached), which is all the walk reads.

Files: `sampler_head_config.json` + `sampler_head.safetensors`, in the drafting adapter's folder.
The head hangs on the model as `model.sbd_sampler_head`; `enabled(model, False)` switches it off.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SBDError
from . import folder as files
from .attach import Slot, setting
from .config import DrafterConfig

CONFIG_NAME = "sampler_head_config.json"
WEIGHTS_NAME = "sampler_head.safetensors"
HEAD_TYPE = "SBD_SAMPLER_HEAD"
DEFAULT_WIDTH = 256
DEFAULT_TOP_K = 8
SLOT = Slot("sbd_sampler_head", "sampler head")


@dataclass
class SamplerHeadConfig(DrafterConfig):
    """What a sampler head is: its inner width, the model size it was made for, and how many of the
    masks' candidates decoding rescores per draft position."""

    FILE = CONFIG_NAME
    KIND_KEY, KIND = "head_type", HEAD_TYPE
    UNREADABLE = "{path}: cannot read a sampler head config ({error})"
    OTHER_KIND = "{path} does not describe an sbd sampler head"

    width: int = DEFAULT_WIDTH
    hidden_size: int = 0
    vocab_size: int = 0
    top_k: int = DEFAULT_TOP_K
    state: bool = False
    head_type: str = HEAD_TYPE

    def __post_init__(self):
        for name in ("width", "top_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SBDError(f"sampler head {name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.state, bool):
            raise SBDError(f"sampler head state must be true or false, got {self.state!r}")


class SamplerHead(nn.Module):
    """h' = h + down(silu(up([h ; E(prev)]) + carry(a_prev))); `down` starts at zero (an untrained head is
    the identity); `carry` (state heads only) starts at zero too."""

    def __init__(self, config: SamplerHeadConfig, dtype=torch.float32, device=None):
        super().__init__()
        self.config = config
        h, w = config.hidden_size, config.width
        self.up = nn.Linear(2 * h, w, bias=True, dtype=dtype, device=device)
        self.down = nn.Linear(w, h, bias=False, dtype=dtype, device=device)
        nn.init.zeros_(self.down.weight)
        self.carry = _zero_carry(w, dtype, device) if config.state else None
        self.enabled = True  # decoding uses it only while enabled (`enabled`)

    def chain_delta(self, hidden: torch.Tensor, prev_embedding: torch.Tensor) -> torch.Tensor:
        """The corrections (R, n, H) added to the hidden states (R, n, H) of n consecutive draft positions,
        given the embeddings (R, n, H) of the tokens before them; a state head carries its activation along
        each row's n positions, from zero before the first."""
        x = torch.cat([hidden, prev_embedding.to(hidden.dtype)], dim=-1)
        pre = F.linear(x, self.up.weight, self.up.bias)
        if self.carry is None:
            return F.linear(F.silu(pre), self.down.weight)
        acts = [F.silu(pre[:, 0])]
        for i in range(1, pre.shape[1]):
            acts.append(F.silu(pre[:, i] + F.linear(acts[-1], self.carry.weight)))
        return F.linear(torch.stack(acts, 1), self.down.weight)


def _zero_carry(width: int, dtype, device) -> nn.Linear:
    """The state's weights U (width × width), at zero: a state that changes nothing until trained."""
    carry = nn.Linear(width, width, bias=False, dtype=dtype, device=device)
    nn.init.zeros_(carry.weight)
    return carry


def head_of(model) -> SamplerHead | None:
    """The sampler head attached to `model`, if any (enabled or not)."""
    return SLOT.of(model)


def active_head(model) -> SamplerHead | None:
    """The head decoding should use: attached and enabled."""
    head = head_of(model)
    return head if head is not None and head.enabled else None


def attach(model, config: SamplerHeadConfig | None = None) -> SamplerHead:
    """Attach a fresh (identity) head to `model` in place and return it; the model is not touched."""
    head = _fresh(model, config or SamplerHeadConfig())
    SLOT.hang(model, head)
    return head


def _fresh(model, config: SamplerHeadConfig) -> SamplerHead:
    """An identity head sized for `model` (on its device, in its dtype), not attached yet."""
    SLOT.check_free(model)
    emb = model.get_input_embeddings().weight
    config.hidden_size, config.vocab_size = int(emb.shape[1]), int(emb.shape[0])
    if model.get_output_embeddings() is None:
        raise SBDError(f"{type(model).__name__} has no output layer; a sampler head needs one")
    return SamplerHead(config, dtype=emb.dtype, device=emb.device)


def add_state(model) -> SamplerHead:
    """Give the model's stateless head a state (`carry` at zero): it drafts exactly as before, and training
    can then teach it to read the chain drafted so far."""
    head = SLOT.require(model, "to give a state")
    if head.carry is None:
        head.carry = _zero_carry(head.config.width, head.up.weight.dtype, head.up.weight.device)
        head.config.state = True
    return head


def detach(model) -> None:
    SLOT.remove(model)


def enabled(model, on: bool):
    """Within the block, decoding uses the model's head only if `on` (a model without one is unaffected)."""
    return setting(head_of(model), "enabled", bool(on))


# -- training ------------------------------------------------------------------------------------------
def chain_hidden(model, head: SamplerHead, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """h + correction at R rows of n consecutive draft positions: hidden (R, n, H), prev (R, n) the tokens
    before them (teacher forcing: the true ones). The output layer of the result gives the head's logits."""
    embedding = F.embedding(prev, model.get_input_embeddings().weight)  # the table itself: no adapter hook
    return hidden + head.chain_delta(hidden, embedding)


@contextlib.contextmanager
def capture_output_input(model):
    """Within the block, `box[0]` receives what the model's output layer was last called with: the final
    hidden states of the positions whose logits are computed (after the final norm)."""
    box: list = [None]

    def hook(module, args):
        box[0] = args[0]

    handle = model.get_output_embeddings().register_forward_pre_hook(hook)
    try:
        yield box
    finally:
        handle.remove()


# -- decoding ------------------------------------------------------------------------------------------
@dataclass
class Drafting:
    """What a verifying row needs to draft with the head: the head, the model (its tables) and the final
    hidden states at the row's logit positions, aligned with its logits."""

    head: SamplerHead
    model: object
    hidden: torch.Tensor  # (n_logits, H)

    def table(self, logits: torch.Tensor, at: int, first: torch.Tensor, probs: bool = False) -> torch.Tensor:
        """`draft_table` for the draft positions whose logits are `logits` (m, V), the row's logit
        positions at, at + 1, …; `first`: the token before the first of them (a 0-d device tensor)."""
        m = logits.shape[0]
        return draft_table(self.head, self.model, self.hidden[at : at + m], logits, first, probs)


def draft_table(head: SamplerHead, model, hidden: torch.Tensor, logits: torch.Tensor,
                first: torch.Tensor, probs: bool = False) -> torch.Tensor:
    """Greedy head drafts for m positions, as a table the host walks (`walk`): (2·m·K,) values, first the
    masks' top-K candidates (m, K) by their own logits, then best (m, K): best[i, j] is the rank of the
    candidate the head picks at position i when position i − 1 holds candidate j (row 0: when it holds
    `first`; all its columns are equal). probs: then also (m, K) more: the head's probability of that
    pick (its softmax over the K candidates), which adaptive drafting reads as the chance that the
    token stands (on SmolLM2 a pick of 0.9 stood 91% of the time, one of 0.3 25%).

    A candidate c scores logits[i, c] + delta_i · W_out[c], which is lm_head(h'_i)[c] for a linear
    output layer: so a zero `down` keeps the masks' own order exactly."""
    m, vocab = logits.shape
    k = min(head.config.top_k, vocab)
    cand = logits.topk(k, dim=-1).indices                                    # (m, K), best first
    base = logits.gather(-1, cand).float()                                   # (m, K)
    table = model.get_input_embeddings().weight
    prev = torch.cat([first.reshape(1, 1).expand(1, k), cand[:-1]])          # (m, K) token before position i
    h = hidden.to(head.up.weight.dtype)
    w1h, w1e = head.up.weight[:, : h.shape[-1]], head.up.weight[:, h.shape[-1]:]
    # the model's tables may be in another dtype than the head (vLLM serves bfloat16 weights by default)
    pre = F.linear(h, w1h, head.up.bias)[:, None] + F.linear(F.embedding(prev, table).to(h.dtype), w1e)  # (m, K, width)
    out = model.get_output_embeddings()  # a quantized output layer gives its rows dequantized (`rows`)
    out_w = (out.rows(cand) if hasattr(out, "rows") else out.weight[cand]).float()  # (m, K, H) candidate rows
    if head.carry is None:
        delta = F.linear(F.silu(pre), head.down.weight)                      # (m, K, H) for each previous j
        scores = base[:, None, :] + torch.einsum("mjh,mch->mjc", delta.float(), out_w)  # (m, K_prev, K)
    else:
        scores = _state_scores(head, pre, base, out_w)
    if not probs:
        return torch.cat([cand.flatten(), scores.argmax(-1).flatten()])
    return torch.cat([cand.flatten().double(), scores.argmax(-1).flatten().double(),
                      scores.softmax(-1).amax(-1).flatten().double()])


def _state_scores(head: SamplerHead, pre: torch.Tensor, base: torch.Tensor, out_w: torch.Tensor) -> torch.Tensor:
    """A state head's scores (m, K_prev, K), position by position along its greedy chain: row i reads the
    activation the chain left at i − 1 (zero before the first). Indices stay on the device (no sync)."""
    rows, state, j = [], None, torch.zeros((), dtype=torch.long, device=pre.device)  # row 0: any column
    for i in range(pre.shape[0]):
        a = F.silu(pre[i] if state is None else pre[i] + F.linear(state, head.carry.weight))  # (K_prev, width)
        row = base[i][None] + F.linear(a, head.down.weight).float() @ out_w[i].T                # (K_prev, K)
        rows.append(row)
        state, j = a[j], row[j].argmax()  # the chain's activation here, and its pick (the next row's column)
    return torch.stack(rows)


def walk(values, m: int, probs: bool = False):
    """The head's greedy chain from a `draft_table` read on the host (m positions); with probs (a table
    made with probs=True), (chain, the head's probability of each of its tokens)."""
    if m == 0:
        return ([], []) if probs else []
    k = len(values) // ((3 if probs else 2) * m)
    cand, best, p = values[: m * k], values[m * k : 2 * m * k], values[2 * m * k :]
    out, picked, prev = [], [], 0
    for i in range(m):
        j = int(best[i * k + prev])  # row 0: every column holds the same pick
        out.append(int(cand[i * k + j]))
        if probs:
            picked.append(float(p[i * k + prev]))
        prev = j
    return (out, picked) if probs else out


# -- files ---------------------------------------------------------------------------------------------
def has_head(folder) -> bool:
    return (Path(folder) / CONFIG_NAME).is_file()


def save(model, folder, dtype: torch.dtype = torch.float32):
    """Write `sampler_head_config.json` and `sampler_head.safetensors` into `folder`."""
    head = SLOT.require(model, "to save")
    return files.save(folder, head.config, head.state_dict(), WEIGHTS_NAME, dtype)


def read_config(folder) -> SamplerHeadConfig:
    return SamplerHeadConfig.read(folder)


def _fitting(head: SamplerHead, folder) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """(parameter of `head`, its saved tensor) pairs from `folder`; SBDError when they do not fit."""
    path = Path(folder) / WEIGHTS_NAME
    saved = files.read_tensors(path, f"{str(folder)!r} has {CONFIG_NAME} but no {WEIGHTS_NAME}")
    params = head.state_dict()
    if set(saved) != set(params) or any(saved[k].shape != params[k].shape for k in params):
        raise SBDError(f"{path} does not fit this model's sampler head (width {head.config.width}, hidden size "
                       f"{head.config.hidden_size}): it was made for another model")
    return [(p, saved[name]) for name, p in head.named_parameters()]


def read(folder, dtype: torch.dtype = torch.float32) -> SamplerHead:
    """The head saved in `folder`, on no model (its `hidden_size` / `vocab_size` say which it fits): for a
    reader that holds it its own way (the vLLM plug-in)."""
    head = SamplerHead(read_config(folder), dtype=dtype)
    files.copy_into(_fitting(head, folder))
    return head


def load_weights(model, folder) -> None:
    """Copy the tensors saved in `folder` into the head already attached to `model` (same parameter
    objects: how a training run resumes)."""
    files.copy_into(_fitting(head_of(model), folder))


def load(model, folder) -> SamplerHead:
    """Attach the head saved in `folder` to `model` (in place) and return it."""
    config = read_config(folder)
    emb = model.get_input_embeddings().weight
    if config.hidden_size != emb.shape[1] or config.vocab_size != emb.shape[0]:
        raise SBDError(f"the sampler head in {str(folder)!r} was made for hidden size {config.hidden_size} and "
                       f"{config.vocab_size} embeddings; this model has {emb.shape[1]} and {emb.shape[0]}")
    head = _fresh(model, config)
    pairs = _fitting(head, folder)
    files.copy_into(pairs)  # filled before it hangs: a refused head leaves nothing behind
    SLOT.hang(model, head)
    return head
