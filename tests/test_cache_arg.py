"""The KV cache reaches a model's forward under the name that forward takes (sbd/models/cache_arg.py):
`cache` from transformers 5.24 on, `past_key_values` before it and for wrappers that name the old one."""

from __future__ import annotations

import inspect
import warnings

import torch
from conftest import _model
from transformers import DynamicCache

import sbd
from sbd.models.cache_arg import cache_name, with_cache


class OldStyle(torch.nn.Module):
    """A model whose forward takes the cache as `past_key_values` (transformers < 5.24, or a wrapper)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, position_ids=None, attention_mask=None, past_key_values=None, use_cache=True,
                logits_to_keep=0):
        self.seen = past_key_values
        return self.inner(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                          **with_cache(self.inner, past_key_values), use_cache=use_cache, logits_to_keep=logits_to_keep)


def test_the_name_is_the_one_the_forward_takes():
    model = _model("llama")
    takes = inspect.signature(model.forward).parameters
    assert cache_name(model) == ("cache" if "cache" in takes else "past_key_values")
    assert cache_name(OldStyle(model)) == "past_key_values"
    cache = DynamicCache(config=model.config)
    assert with_cache(model, cache) == {cache_name(model): cache}


def test_a_cached_forward_warns_nothing_and_fills_the_cache():
    """The name we pass is the one the model reads: the cache fills (a wrong name would leave it empty or
    raise), and no deprecation warning is raised on any transformers version."""
    model = _model("llama")
    ids = torch.tensor([[5, 6, 7, 8]], device=model.device)
    cache = DynamicCache(config=model.config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with torch.no_grad():
            model(input_ids=ids, **with_cache(model, cache), use_cache=True)
    assert cache.get_seq_length() == 4


def test_generate_through_an_old_style_forward_equals_the_model():
    """The engine hands the cache to a forward that names it `past_key_values` and gets the same tokens."""
    model = _model("llama")
    old = OldStyle(model)
    prompt = [[3, 9, 4, 11, 7]]
    want = sbd.generate(model, None, prompt, method="ntp", max_new_tokens=6).token_ids
    got = sbd.generate(old, None, prompt, method="ntp", max_new_tokens=6).token_ids
    assert got == want and old.seen is not None
