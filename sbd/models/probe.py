"""Conformance probe: does this model honour what SBD decoding relies on?

SBD talks to a model only through `input_ids`, `position_ids`, a 4-D bool `attention_mask` and a
KV cache. An architecture (or attention backend) that ignores or misreads one of them would decode
wrongly without failing, so `sbd.load` runs these checks on the loaded model and refuses it instead.
"""

from __future__ import annotations

import torch

from ..drafters.adapter import adapter_of, gated
from ..errors import SBDError
from ..masks import inference_mask
from ..modes import eval_mode
from .cache_arg import with_cache
from .slab import slab_cache


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    a, b = a.float(), b.float()
    return bool((a - b).abs().max() <= tol * (1.0 + a.abs().max()))


def probe_model(model, prefix_len: int = 8, block: int = 4, seed: int = 0) -> None:
    """Raise SBDError naming the first property the model fails. Runs a handful of tiny forwards."""
    name = type(model).__name__
    device = model.get_input_embeddings().weight.device
    dtype = model.get_input_embeddings().weight.dtype
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(seed)
    n = prefix_len + block
    ids = torch.randint(0, vocab, (1, n), generator=g).to(device)
    pos = torch.arange(n, device=device)[None]
    pad = torch.zeros(1, dtype=torch.long, device=device)
    causal = inference_mask(pad, 0, n, 0)
    blockwise = inference_mask(pad, 0, prefix_len, block)

    def run(input_ids, position_ids, mask, cache=None):
        return model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                     **with_cache(model, cache), use_cache=cache is not None).logits

    with torch.no_grad():
        for pname, param in model.named_parameters():
            if param.is_floating_point() and not bool(torch.isfinite(param).all()):
                raise SBDError(f"{name}'s weights are not finite: {pname} holds NaN or infinite values")
    try:
        with eval_mode(model), torch.inference_mode():
            plain = model(input_ids=ids).logits
            ours = run(ids, pos, causal)
            if not _close(plain, ours, tol):
                raise SBDError(f"{name} does not read a 4-D bool attention mask as 'True = attend' "
                               "(load it with attn_implementation='sdpa')")
            full = run(ids, pos, blockwise)
            changed = ids.clone()
            changed[0, -1] = (changed[0, -1] + 1) % vocab
            seen = run(changed, pos, blockwise)
            if _close(full[:, prefix_len], seen[:, prefix_len], 1e-6):
                raise SBDError(f"{name} ignores non-causal entries of a 4-D attention mask "
                               "(its attention applies its own causal mask)")
            if not _close(full[:, :prefix_len], seen[:, :prefix_len], tol):
                raise SBDError(f"{name} lets a position attend to tokens the 4-D mask hides")
            shifted = pos.clone()
            shifted[0, prefix_len:] += 3
            if _close(run(ids, shifted, blockwise)[:, prefix_len:], full[:, prefix_len:], 1e-6):
                raise SBDError(f"{name} ignores position_ids")
            if adapter_of(model) is not None:  # a drafting adapter must leave the causal positions alone
                with gated(model, prefix_len):
                    drafted = run(ids, pos, blockwise)
                if not _close(drafted[:, :prefix_len], full[:, :prefix_len], tol):
                    raise SBDError(f"{name}'s drafting adapter changes the logits of causal positions; sbd-verify "
                                   "would not reproduce the model's own answers")
            cache = slab_cache(model, n)
            run(ids[:, :prefix_len], pos[:, :prefix_len], causal[..., :prefix_len, :prefix_len], cache)
            cached = run(ids[:, prefix_len:], pos[:, prefix_len:], inference_mask(pad, prefix_len, 0, block), cache)
            if not _close(cached, full[:, prefix_len:], tol):
                raise SBDError(f"{name} gives different logits with a KV cache than without one")
    except SBDError:
        raise
    except Exception as e:  # a model that cannot even run these calls is refused the same way
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SBDError(f"{name} failed the SBD conformance probe: {first}") from None
