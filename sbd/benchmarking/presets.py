"""Random-weight models with the shapes of real ones: forward cost depends on shapes, not on weights, so
a model that cannot be downloaded can still be timed (e.g. a Llama-3.1-8B-shaped model on a GPU)."""

from __future__ import annotations

import torch

from ..errors import SBDError

# Llama-family shapes (hidden, layers, heads, kv_heads, intermediate, vocab, context).
SHAPES = {
    "llama-3.1-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
                         rope_theta=500000.0),
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192,
                         rope_theta=100000.0, tie_word_embeddings=True),
    # two layers with grouped-query attention: dry runs of the GPU script (every code path, seconds)
    "tiny-gqa": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=256, vocab_size=512, max_position_embeddings=1024),
    "bench-21m": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                      intermediate_size=1376, vocab_size=8192, max_position_embeddings=2048),
}


def random_model_like(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0):
    """A LlamaForCausalLM with the shapes of `name` and random weights, in eval mode, SDPA attention,
    with an SBD mask token id (the last vocabulary entry) so that every decoding method runs."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    if name not in SHAPES:
        raise SBDError(f"unknown model shape {name!r}; choose one of {', '.join(SHAPES)}")
    shape = dict(SHAPES[name])
    theta = shape.pop("rope_theta", 10000.0)
    config = LlamaConfig(**shape, rope_parameters={"rope_type": "default", "rope_theta": theta})
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    model.config.sbd_mask_token_id = config.vocab_size - 1
    model.generation_config.eos_token_id = None
    return model.eval()
