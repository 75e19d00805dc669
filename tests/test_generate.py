"""`sbd.generate`: stopping rules on a scripted model, stop strings, errors for bad input."""

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig

import sbd
from sbd import SBDError

from conftest import random_prompts

V, MASK, EOS = 32, 31, 2


class ScriptedLM(torch.nn.Module):
    """A stand-in causal LM whose logits depend only on the position: position p predicts
    script[p] = (token, confidence), the token's logit above an otherwise flat row (higher = surer)."""

    def __init__(self, script, default=(5, 3.0), nan_at=None):
        super().__init__()
        self.config = LlamaConfig(vocab_size=V, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                  max_position_embeddings=64)
        self.config.sbd_mask_token_id = MASK
        self.generation_config = GenerationConfig(eos_token_id=EOS)
        self.embed = torch.nn.Embedding(V, 4)
        self.script, self.default, self.nan_at, self.calls = script, default, nan_at, 0

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, position_ids, attention_mask, past_key_values, use_cache=True, logits_to_keep=0):
        b, q = input_ids.shape
        past_key_values.update(torch.zeros(b, 1, q, 1), torch.zeros(b, 1, q, 1), 0)
        self.calls += 1
        logits = torch.zeros(b, q, V)
        for i in range(b):
            for j in range(q):
                token, confidence = self.script.get(int(position_ids[i, j]), self.default)
                logits[i, j, token] = confidence
        if self.nan_at is not None and self.calls > self.nan_at:
            logits[:] = math.nan
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def test_eos_stops_only_once_every_earlier_position_is_revealed():
    # Prompt at positions 0-1, block at 2-5: EOS at 4 is the most certain, then 2, then 3, then 5.
    model = ScriptedLM({2: (10, 6.0), 3: (11, 4.0), 4: (EOS, 50.0), 5: (12, 2.0)})
    out = sbd.generate(model, None, [[7, 8]], method="sbd", block_size=4, gamma=0.0, max_new_tokens=8)
    assert out.token_ids == [[10, 11, EOS]]  # position 5 is discarded
    assert out.steps == [[2, 3, 1]]  # EOS came first, the row stopped when 3 was revealed
    assert out.nfe == [3]


def test_no_forward_is_spent_after_the_predicted_end():
    """EOS-padded models predict EOS after the answer with the highest certainty; those positions are
    discarded, so the sampler may not spend forwards on them. Block 2-9, answer 2-4, EOS at 5."""
    script = {2: (10, 3.0), 3: (11, 4.0), 4: (12, 5.0), 5: (EOS, 6.0), **{p: (EOS, 50.0) for p in range(6, 10)}}
    out = sbd.generate(ScriptedLM(script), None, [[7, 8]], method="sbd", block_size=8, gamma=0.0, max_new_tokens=8)
    assert out.token_ids == [[10, 11, 12, EOS]]
    assert out.steps == [[4, 3, 2, 1]] and out.nfe == [4]  # one forward per kept token, none after EOS


@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_gamma_zero_never_needs_more_forwards_than_tokens(block_size):
    """γ = 0 on models whose predictions hold still (an answer, then EOS to the end of the block), with
    random certainties, the positions after EOS often the surest: NFE never exceeds the tokens kept."""
    g = torch.Generator().manual_seed(block_size)
    for trial in range(40):
        n = int(torch.randint(1, 30, (1,), generator=g))
        conf = (torch.rand(64, generator=g) * 20 + 1).tolist()
        script = {2 + i: (10 + i % 15, conf[i]) for i in range(n)}
        script.update({2 + i: (EOS, conf[i] * (5 if trial % 2 else 1)) for i in range(n, 60)})
        out = sbd.generate(ScriptedLM(script), None, [[7, 8]], method="sbd", block_size=block_size, gamma=0.0, max_new_tokens=48)
        assert len(out.token_ids[0]) == n + 1
        assert out.nfe[0] <= len(out.token_ids[0]), (trial, out.nfe, out.steps)


def test_eos_in_a_later_block_and_budget_end():
    model = ScriptedLM({9: (EOS, 50.0)}, default=(6, 50.0))
    out = sbd.generate(model, None, [[7, 8]], method="sbd", block_size=4, gamma=math.inf, max_new_tokens=20)
    assert out.token_ids == [[6] * 7 + [EOS]] and out.nfe == [2]
    short = sbd.generate(model, None, [[7, 8]], method="sbd", block_size=4, gamma=math.inf, max_new_tokens=6)
    assert short.token_ids == [[6] * 6] and short.nfe == [2]  # blocks of 4 then 2 (the remainder)


def test_nan_logits_stop_decoding_with_a_clear_error():
    for method in ("ntp", "sbd"):
        model = ScriptedLM({}, nan_at=2)
        with pytest.raises(SBDError, match="NaN"):
            sbd.generate(model, None, [[7, 8, 9]], method=method, max_new_tokens=10)


def test_stop_strings_cut_text_and_tokens(llama, tokenizer):
    prompt = "The quick brown"
    free = sbd.generate(llama, tokenizer, [prompt], method="sbd", gamma=0.0, max_new_tokens=24, eos_token_ids=[])
    text = free.texts[0]
    stop = text[8:11]
    assert stop and stop.strip()
    cut = sbd.generate(llama, tokenizer, [prompt], method="sbd", gamma=0.0, max_new_tokens=24, eos_token_ids=[], stop=[stop])
    assert cut.texts[0] == text[: text.index(stop)]
    n = len(cut.token_ids[0])
    assert cut.token_ids[0] == free.token_ids[0][:n] and n < 24
    assert stop in tokenizer.decode(cut.token_ids[0]) and stop not in tokenizer.decode(cut.token_ids[0][:-1])
    ntp = sbd.generate(llama, tokenizer, [prompt], method="ntp", max_new_tokens=24, eos_token_ids=[], stop=[stop])
    assert stop not in ntp.texts[0] and ntp.nfe[0] == len(ntp.token_ids[0])


def test_string_prompts_and_result_fields(llama, tokenizer):
    out = sbd.generate(llama, tokenizer, ["hello", "The quick brown fox"], method="sbd", max_new_tokens=10)
    assert len(out.texts) == 2 and all(isinstance(t, str) for t in out.texts)
    assert out.tokens_per_forward == out.num_tokens / sum(out.nfe) and out.seconds > 0
    assert out.prompt_lengths == [len(tokenizer("hello").input_ids), len(tokenizer("The quick brown fox").input_ids)]


def test_temperature_sampling_is_reproducible_with_a_seed(llama):
    prompts = random_prompts(2, llama.config.vocab_size)
    kw = dict(temperature=1.0, max_new_tokens=20, eos_token_ids=[])
    for method in ("ntp", "sbd"):
        a = sbd.generate(llama, None, prompts, method=method, seed=7, **kw)
        b = sbd.generate(llama, None, prompts, method=method, seed=7, **kw)
        c = sbd.generate(llama, None, prompts, method=method, seed=8, **kw)
        assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompts=[]), "no prompts"),
    (dict(prompts=[[]]), "prompt 0 is empty"),
    (dict(prompts=["ok", ""]), "prompt 1 is empty"),
    (dict(block_size=0), "block_size"),
    (dict(gamma=-1.0), "gamma"),
    (dict(gamma=float("nan")), "gamma"),
    (dict(proxy="perplexity"), "proxy"),
    (dict(method="beam"), "method"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=600), "context"),
    (dict(temperature=-1.0), "temperature"),
    (dict(prompts=[[10**6]]), "vocabulary"),
    (dict(stop="x"), "stop"),
])
def test_bad_input_is_refused_before_any_model_call(llama, tokenizer, kwargs, message):
    calls = []
    handle = llama.register_forward_hook(lambda *a: calls.append(1))
    try:
        args = {"prompts": ["hello"], **kwargs}
        with pytest.raises(SBDError, match=message):
            sbd.generate(llama, tokenizer, args.pop("prompts"), **args)
    finally:
        handle.remove()
    assert not calls


def test_sbd_without_a_mask_token_says_how_to_add_one(tokenizer):
    from sbd.models import tiny

    model = tiny.random_model(tiny.tiny_config("llama", vocab_size=len(tokenizer)))
    with pytest.raises(SBDError, match="add_mask_token"):
        sbd.generate(model, tokenizer, ["hi"], method="sbd")
    assert sbd.generate(model, tokenizer, ["hi"], method="ntp", max_new_tokens=3).nfe == [3]
