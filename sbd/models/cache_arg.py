"""How to hand a KV cache to a model's forward, whatever the transformers version.

transformers 5.24 renamed the forward's `past_key_values` argument to `cache` (the old name warns on
every call and goes away in 5.40); earlier 5.x releases know only `past_key_values`. Every place in sbd
that calls a model with a cache asks here which name the model's forward takes.
"""

from __future__ import annotations

import inspect

_NAMES: dict = {}


def cache_name(model) -> str:
    """"cache" when the model's forward takes that argument, else "past_key_values" (older transformers,
    or a wrapper whose forward names the old argument or takes **kwargs)."""
    kind = type(model)
    name = _NAMES.get(kind)
    if name is None:
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # a forward without a readable signature
            params = {}
        name = _NAMES[kind] = "cache" if "cache" in params else "past_key_values"
    return name


def with_cache(model, cache) -> dict:
    """{name: cache} to pass as keyword arguments: `model(input_ids=..., **with_cache(model, cache))`."""
    return {cache_name(model): cache}
