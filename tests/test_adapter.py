"""The drafting adapter (docs/method.md §7): gated to block positions, so the model stays itself.

- sbd-verify with an adapter gives the ORIGINAL model's Hugging Face greedy tokens, on four
  architectures, alone and batched (the adapter has large random updates: a leak would show);
- the adapter does act on block positions (plain SBD decodes differently with it);
- the cache of committed tokens is the original model's causal prefill;
- the two-pass training forward gives the loss and adapter gradients of the plain doubled forward;
- peft's file layout, load/save round trip, refusals (leaky adapter, ordinary LoRA, wrong model, merge).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import attach_random_adapter, hf_greedy, random_prompts, trainable_adapted
from safetensors.torch import load_file
from transformers import DynamicCache

import sbd
from sbd.drafters import adapter as adapters
from sbd.errors import SBDError
from sbd.models.cache_arg import with_cache
from sbd.models import tiny
from sbd.models.probe import probe_model
from sbd.training.adapter_forward import adapter_logits, kl_sum, plain_adapter_logits
from sbd.training.collator import IGNORE, SBDDataCollator


@pytest.fixture
def adapted(model):
    attach_random_adapter(model)
    yield model
    adapters.detach(model)


@pytest.mark.parametrize("block_size", [4, 8])
def test_verify_with_adapter_gives_the_original_models_hf_greedy_tokens(adapted, block_size):
    prompts = random_prompts(5, adapted.config.vocab_size)
    ref = [hf_greedy(adapted, p, 30) for p in prompts]  # the adapter is off outside sbd's forwards
    alone = [sbd.generate(adapted, None, [p], method="sbd-verify", block_size=block_size,
                          max_new_tokens=30).token_ids[0] for p in prompts]
    batched = sbd.generate(adapted, None, prompts, method="sbd-verify", block_size=block_size, max_new_tokens=30)
    assert alone == ref
    assert batched.token_ids == ref


def test_the_adapter_acts_on_block_positions(model):
    prompts = random_prompts(3, model.config.vocab_size)
    plain = sbd.generate(model, None, prompts, method="sbd", block_size=4, gamma=0.35, max_new_tokens=24,
                         eos_token_ids=[])
    attach_random_adapter(model)
    try:
        drafted = sbd.generate(model, None, prompts, method="sbd", block_size=4, gamma=0.35, max_new_tokens=24,
                               eos_token_ids=[])
    finally:
        adapters.detach(model)
    assert drafted.token_ids != plain.token_ids


def test_committed_cache_is_the_original_models_prefill(llama):
    attach_random_adapter(llama)
    seen = []
    try:
        prompt = random_prompts(1, llama.config.vocab_size, lengths=(6,))
        out = sbd.generate(llama, None, prompt, method="sbd-verify", block_size=4, max_new_tokens=20,
                           eos_token_ids=[], observer=lambda r: seen.append(
                               [(k[None].clone(), v[None].clone()) for k, v in r.committed(0)]))
    finally:
        adapters.detach(llama)
    cached = seen[-1]
    length = cached[0][0].shape[2]
    ids = torch.tensor([prompt[0] + out.token_ids[0]], device=llama.device)[:, :length]
    ref = DynamicCache(config=llama.config)
    with torch.no_grad():
        llama(input_ids=ids, **with_cache(llama, ref), use_cache=True)
    for (k, v), layer in zip(cached, ref.layers):
        assert (k - layer.keys).abs().max() <= 1e-4 and (v - layer.values).abs().max() <= 1e-4


def _doubled_batch(tokenizer, block_size=4, rate=0.6):
    c = SBDDataCollator(tokenizer, mask_token_id=tokenizer.mask_token_id, block_size=block_size,
                        align_to_completion=True)
    feats = [{"input_ids": list(range(5, 5 + n)), "prompt_length": p} for n, p in ((20, 5), (13, 3), (9, 2))]
    clean = c.pad(feats)
    m = c.noisy_length(clean, block_size)
    u = torch.rand(3, m, generator=torch.Generator().manual_seed(1))
    batch = c.corrupt(clean, block_size, torch.full((3,), rate), u)
    n = batch.pop("num_clean")
    labels = batch.pop("labels")
    labels[:, :n] = IGNORE
    j = torch.arange(m)
    source = torch.where(j[None] < (clean["lengths"] - clean["prompt_lengths"])[:, None],
                         clean["prompt_lengths"][:, None] + j[None], -1)
    return batch, labels, n, source


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_two_pass_training_forward_equals_the_doubled_forward(arch, tokenizer):
    model, ad = trainable_adapted(arch, tokenizer, seed=3)
    batch, labels, n, source = _doubled_batch(tokenizer)
    targets = labels[labels != IGNORE]
    model.train()

    def loss_and_grads(logits, extra=0.0):
        loss = torch.nn.functional.cross_entropy(logits, targets) + extra
        return loss.detach(), torch.autograd.grad(loss, list(ad.parameters()))

    out = adapter_logits(model, batch, labels, n, source)
    fast_loss, fast = loss_and_grads(out.logits, 0.3 * kl_sum(out.logits, out.base_logits, out.kl_valid))
    ref_logits = plain_adapter_logits(model, batch, labels, n)
    # the frozen model's next-token logits for each target, from the doubled forward's clean half
    with adapters.gated(model, n):
        full = model(**batch, use_cache=False).logits
    rows = (labels[:, n:] != IGNORE).nonzero()[:, 0]
    src = source[labels[:, n:] != IGNORE]
    base = full[rows, (src - 1).clamp_min(0)].detach()
    ref_loss, ref = loss_and_grads(ref_logits, 0.3 * kl_sum(ref_logits, base, src >= 1))
    assert abs(fast_loss - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))
    for a, b in zip(fast, ref):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max())
    assert any(g.abs().max() > 0 for g in fast)  # the test can fail: the gradients are not all zero


def test_two_pass_forward_on_modeling_code_without_2d_logits_to_keep(tokenizer):
    """transformers 5.17's models index `hidden_states[:, keep, :]` (IndexError on a 2-D `keep`, seen on a GPU
    machine): a model class whose module lacks the slicing helper gets full logits, and the same rows."""
    model, _ = trainable_adapted("llama", tokenizer, seed=3)
    batch, labels, n, source = _doubled_batch(tokenizer)
    with torch.no_grad():
        want = adapter_logits(model, batch, labels, n, source, with_hidden=True)
        cls = type(model)
        model.__class__ = type("OlderLlama", (cls,), {"__module__": "older_transformers_modeling"})
        try:
            got = adapter_logits(model, batch, labels, n, source, with_hidden=True)
        finally:
            model.__class__ = cls
    torch.testing.assert_close(got.logits, want.logits)
    torch.testing.assert_close(got.hidden, want.hidden)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("start", [0, 3, "per-row"])
def test_decoding_fast_paths_compute_the_training_paths_update(llama, rows, start):
    """Decoding adds the update in place (one 2-D product for a single row, a batched one for several);
    training adds it out of place under autograd. Both must give the same logits, and the causal part
    must stay the frozen model's."""
    ad = attach_random_adapter(llama, scale=0.1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, llama.config.vocab_size, (rows, 9), generator=g, device="cpu").to(llama.device)
    s = torch.tensor([2, 5, 0][:rows], device=llama.device) if start == "per-row" else start
    try:
        with torch.inference_mode(), adapters.gated(llama, s):
            fast = llama(input_ids=ids).logits
        with torch.enable_grad(), adapters.gated(llama, s):
            slow = llama(input_ids=ids).logits.detach()
        plain = llama(input_ids=ids).logits.detach()
    finally:
        adapters.detach(llama)
    assert (fast - slow).abs().max() <= 1e-5 * slow.abs().max()
    first = int(s.min()) if isinstance(s, torch.Tensor) else s
    if first:
        assert torch.equal(fast[:, :first], plain[:, :first])  # the gate: causal positions untouched
    assert (fast[:, -1] - plain[:, -1]).abs().max() > 1e-3  # the update acts: the test can fail


def test_save_load_round_trip_in_peft_layout(llama, tmp_path):
    attach_random_adapter(llama)
    prompts = random_prompts(3, llama.config.vocab_size)
    try:
        before = sbd.generate(llama, None, prompts, method="sbd", block_size=4, max_new_tokens=20, eos_token_ids=[])
        adapters.save(llama, tmp_path)
    finally:
        adapters.detach(llama)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    keys = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert keys["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"].shape == (64, 4)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["peft_type"] == adapters.ADAPTER_TYPE and config["r"] == 4 and config["block_size"] == 4
    adapters.load(llama, tmp_path)
    try:
        after = sbd.generate(llama, None, prompts, method="sbd", max_new_tokens=20, eos_token_ids=[])
    finally:
        adapters.detach(llama)
    assert after.token_ids == before.token_ids  # and block_size defaulted to the adapter's 4


def test_sbd_load_attaches_and_an_adapter_folder_names_its_base(tmp_path):
    model, tok = tiny.create(tmp_path / "base", vocab_size=300, hidden=32, layers=2, heads=4, kv_heads=2, context=128)
    attach_random_adapter(model)
    adapters.save(model, tmp_path / "ad")
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "base")
    (tmp_path / "ad" / "adapter_config.json").write_text(json.dumps(cfg))
    m1, _ = sbd.load(tmp_path / "base", adapter=tmp_path / "ad")
    m2, _ = sbd.load(tmp_path / "ad")
    for m in (m1, m2):
        a = adapters.adapter_of(m)
        assert a is not None and torch.equal(a.mask_embedding, adapters.adapter_of(model).mask_embedding)


def test_refusals(llama, tmp_path):
    attach_random_adapter(llama)
    try:
        adapters.save(llama, tmp_path / "ok")
        with pytest.raises(SBDError, match="cannot be merged"):
            adapters.merge(llama)
    finally:
        adapters.detach(llama)
    plain = tmp_path / "lora"
    plain.mkdir()
    (plain / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    with pytest.raises(SBDError, match="ordinary LoRA acts on every position"):
        adapters.load(llama, plain)
    wrong = tiny.random_model(tiny.tiny_config("llama", vocab_size=llama.config.vocab_size, hidden=32, layers=2))
    wrong.config.sbd_mask_token_id = llama.config.sbd_mask_token_id
    with pytest.raises(SBDError, match="made for another model"):
        adapters.load(wrong, tmp_path / "ok")
    assert adapters.adapter_of(wrong) is None  # a refused adapter leaves nothing behind


def test_probe_refuses_an_adapter_that_leaks_into_causal_positions(llama, monkeypatch):
    def leaky(adapter, name):
        def hook(module, args, output):
            return output if adapter.start is None else output + adapter.delta(name, args[0])  # every position
        return hook

    monkeypatch.setattr(adapters, "_linear_hook", leaky)
    attach_random_adapter(llama)
    try:
        with pytest.raises(SBDError, match="changes the logits of causal positions"):
            probe_model(llama)
    finally:
        adapters.detach(llama)
    attach_random_adapter(llama)  # the real hooks pass
    try:
        monkeypatch.undo()
        adapters.detach(llama)
        attach_random_adapter(llama)
        probe_model(llama)
    finally:
        adapters.detach(llama)
