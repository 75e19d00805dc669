"""Small random models and byte-level BPE tokenizers built locally (no hub): for tests, benchmarks and
`sbd init`, the starting point of a model trained from scratch."""

from __future__ import annotations

from typing import Iterable

import torch

EOS, PAD, MASK = "<|endoftext|>", "<|pad|>", "<|mask|>"
ARCHS = ("llama", "qwen2", "qwen3", "mistral")

SAMPLE_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Set block decoding reveals several tokens of a block in one forward pass.",
    "12 + 34 = 46. 7 * 8 = 56. 100 - 1 = 99.",
    "def add(a, b):\n    return a + b\n",
]


def build_tokenizer(texts: Iterable[str] = SAMPLE_TEXT, vocab_size: int = 512):
    """A byte-level BPE tokenizer trained on `texts`, with EOS, pad and mask special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, PAD, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, mask_token=MASK)


def tiny_config(arch: str = "llama", vocab_size: int = 512, hidden: int = 64, layers: int = 2,
                heads: int = 4, kv_heads: int = 2, intermediate: int | None = None, context: int = 1024):
    """A decoder config of one of the supported families, untied so the output layer can be scaled."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}
    if arch not in cls:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    kw = dict(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate or 4 * hidden,
        max_position_embeddings=context, tie_word_embeddings=False,
    )
    if arch == "qwen3":
        kw["head_dim"] = hidden // heads
    if arch == "mistral":
        kw["sliding_window"] = context
    return cls[arch](**kw)


def random_model(config, seed: int = 0, logit_scale: float = 1.0):
    """A randomly initialised causal LM in fp32 with SDPA attention.

    `logit_scale` multiplies the output layer so that logits are decisive (tests compare tokens).
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    if logit_scale != 1.0:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(logit_scale)
    return model.eval()


def create(out_dir, arch: str = "llama", texts: Iterable[str] = SAMPLE_TEXT, vocab_size: int = 512,
           seed: int = 0, **sizes):
    """Write a random model + tokenizer (with its mask token recorded) to `out_dir`; returns both."""
    from .folders import add_mask_token

    tokenizer = build_tokenizer(texts, vocab_size)
    config = tiny_config(arch, vocab_size=len(tokenizer), **sizes)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    model = random_model(config, seed=seed)
    add_mask_token(model, tokenizer)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model, tokenizer
