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
token before it). `draft_table` (`sbd.decoding.proposers.head`) computes, on the device and in one batch, the best candidate at every
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
