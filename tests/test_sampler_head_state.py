"""The sampler head with a state (`SamplerHeadConfig(state=True)`): each draft reads its own inner
activation from the position before, not only the previous token.

Decoding: the table walked on the host equals the chain computed from the definition, one position after
the other; a head that gains a state at zero drafts exactly as before; the state carries what came before
the last token. Exactness: random state heads keep Hugging Face greedy (chain, tree, adaptive, lookup;
batch = alone). Training: the training forward's head logits equal the definition by hand along each
block; `--sampler-head-state` continues a stateless head from a zero state and a saved state head loads
back with the same drafts; option misuse is refused in one line.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import _model, attach_random_adapter, hf_greedy, random_prompts
from test_sampler_head import _argv, _run, _setup, attach_random_head, head_training_forward, random_positions

import sbd
from sbd.drafters import adapter as adapters
from sbd.decoding.proposers import head as head_drafts
from sbd.drafters import sampler_head as heads
from sbd.cli import main


def attach_state_head(model, seed=0, scale=3.0, width=16, top_k=8):
    """A random non-zero head whose state weighs as much as its inputs."""
    head = attach_random_head(model, seed=seed, scale=scale, width=width, top_k=top_k)
    try:
        heads.add_state(model)
        g = torch.Generator().manual_seed(seed + 1000)  # drawn on the CPU: the same state on every device
        with torch.no_grad():
            carry = torch.randn(head.carry.weight.shape, generator=g, device="cpu")
            head.carry.weight.copy_(carry * 2.0 / width ** 0.5)
    except BaseException:
        heads.detach(model)  # not half made and left behind on a shared model
        raise
    return head


def naive_state_chain(model, head, hidden, logits, first, top_k):
    """The state head's greedy drafts from the definition: a_i = silu(W1 [h_i; E(t_{i-1})] + b + U a_{i-1})."""
    emb, out = model.get_input_embeddings().weight, model.get_output_embeddings()
    picks, prev, a = [], int(first), torch.zeros(head.config.width, device=hidden.device)
    for i in range(hidden.shape[0]):
        a = F.silu(head.up.weight @ torch.cat([hidden[i], emb[prev]]) + head.up.bias + head.carry.weight @ a)
        cand = logits[i].topk(top_k).indices
        prev = int(cand[out(hidden[i] + head.down.weight @ a)[cand].argmax()])
        picks.append(prev)
    return picks


@pytest.mark.parametrize("top_k", [1, 3, 8])
def test_state_table_walk_equals_the_chain_by_definition(top_k):
    model = _model("qwen2")
    head = attach_state_head(model, seed=1, top_k=top_k)
    try:
        apart = 0
        for hidden, logits in random_positions(model, 6):
            first = torch.tensor(7, device=model.device)
            with torch.no_grad():
                values = head_drafts.draft_table(head, model, hidden, logits, first).tolist()
                with_p = head_drafts.draft_table(head, model, hidden, logits, first, probs=True).tolist()
                want = naive_state_chain(model, head, hidden, logits, 7, top_k)
                carry, head.carry = head.carry, None  # the same head without its state
                stateless = head_drafts.walk(head_drafts.draft_table(head, model, hidden, logits, first).tolist(), 6)
                head.carry = carry
            assert head_drafts.walk(values, 6) == want == head_drafts.walk(with_p, 6, probs=True)[0]
            apart += want != stateless
        assert apart if top_k > 1 else not apart  # the state changed some chains (top_k 1: nothing to choose)
    finally:
        heads.detach(model)


def test_a_head_that_gains_a_state_drafts_as_before():
    model = _model("llama")
    head = attach_random_head(model, seed=3, scale=3.0)
    try:
        g = torch.Generator().manual_seed(4)
        hidden = torch.randn(7, model.config.hidden_size, generator=g, device="cpu").to(model.device)
        logits = model.get_output_embeddings()(hidden)
        first = torch.tensor(5, device=model.device)
        with torch.no_grad():
            before = head_drafts.draft_table(head, model, hidden, logits, first, probs=True).tolist()
            assert heads.add_state(model) is head and head.config.state and not head.carry.weight.any()
            after = head_drafts.draft_table(head, model, hidden, logits, first, probs=True).tolist()
        chain, p = head_drafts.walk(before, 7, probs=True)
        assert head_drafts.walk(after, 7, probs=True)[0] == chain
        # a zero state adds a zero term; CUDA's float32 products of another shape round differently (~1e-5)
        assert head_drafts.walk(after, 7, probs=True)[1] == pytest.approx(p, abs=1e-6 if model.device.type == "cpu"
                                                                           else 1e-4)
        assert heads.add_state(model) is head  # a head that has one keeps it
    finally:
        heads.detach(model)
    with pytest.raises(sbd.SBDError, match="no sampler head"):
        heads.add_state(model)


def test_the_state_carries_what_came_before_the_last_token():
    model = _model("llama")
    head = attach_state_head(model, seed=5)
    try:
        g = torch.Generator().manual_seed(6)
        hidden = torch.randn(1, 4, model.config.hidden_size, generator=g, device="cpu").to(model.device)
        emb = torch.randn(1, 4, model.config.hidden_size, generator=g, device="cpu").to(model.device)
        with torch.no_grad():
            d = head.chain_delta(hidden, emb)
            emb2 = emb.clone()
            emb2[0, 0] += 1.0  # only the token before the first position differs
            d2 = head.chain_delta(hidden, emb2)
            assert not torch.allclose(d[0, 3], d2[0, 3])  # three positions later, it still shows
            head.carry = None
            assert torch.equal(head.chain_delta(hidden, emb)[0, 3], head.chain_delta(hidden, emb2)[0, 3])
    finally:
        heads.detach(model)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_random_state_head_keeps_hugging_face_greedy_and_batch_equals_alone(arch, cheap_width):
    model = _model(arch)
    base = random_prompts(4, model.config.vocab_size, seed=31)
    prompts = base[:2] + [p + p for p in base[2:]]
    refs = [hf_greedy(model, p, 24) for p in prompts]
    attach_random_adapter(model, seed=6)
    attach_state_head(model, seed=7)
    try:
        for kw in ({}, dict(tree=(3, 2)), dict(draft="adaptive", lookup=True)):
            out = sbd.generate(model, None, prompts, method="sbd-verify", block_size=5, max_new_tokens=24, **kw)
            assert out.token_ids == refs, kw
            for i, p in enumerate(prompts):
                alone = sbd.generate(model, None, [p], method="sbd-verify", block_size=5, max_new_tokens=24, **kw)
                assert (alone.token_ids[0], alone.nfe[0], alone.accepted[0]) == \
                    (out.token_ids[i], out.nfe[i], out.accepted[i]), kw
    finally:
        heads.detach(model)
        adapters.detach(model)


def test_training_state_logits_equal_the_definition_by_hand(tokenizer):
    model = _model("qwen2", seed=4)
    attach_random_adapter(model, seed=16)
    head = attach_state_head(model, seed=17)
    try:
        k = 4
        _, batch, prev, _, (logits, target, use), hidden = head_training_forward(model, tokenizer, k)
        n, labels = batch["num_clean"], batch["labels"]
        emb = model.get_input_embeddings().weight
        labelled = labels[:, n:] != -100
        assert (~labelled).any() and sum(labelled[:, j].sum() for j in range(3, labelled.shape[1], k)) > 2
        at = 0
        for b in range(labelled.shape[0]):  # row-major, as the logits; every place of a block runs the chain
            for j in range(labelled.shape[1]):
                if j % k == 0:
                    a = torch.zeros(head.config.width, device=hidden.device)  # a new block: the state starts at zero
                    continue
                # a place without a label (a revealed token, padding) feeds the chain a zero hidden state
                h = hidden[b, n + j] if labelled[b, j] else torch.zeros_like(hidden[b, n + j])
                a = F.silu(head.up.weight @ torch.cat([h, emb[int(prev[b, j])]]) + head.up.bias
                           + head.carry.weight @ a)
                if not labelled[b, j]:
                    continue
                want = model.get_output_embeddings()(h + head.down.weight @ a)
                torch.testing.assert_close(logits[at], want, atol=1e-3, rtol=1e-4)  # logits of ~100s
                assert int(target[at]) == int(labels[b, n + j])
                at += 1
        assert at == len(logits)
    finally:
        heads.detach(model)
        adapters.detach(model)


def test_head_state_option_continues_a_stateless_head_and_loads_back(tmp_path, capsys):
    _setup(tmp_path)
    assert main(_argv(tmp_path, tmp_path / "model", tmp_path / "ad", 4, ["--sampler-head"])) == 0
    assert main(_argv(tmp_path, tmp_path / "ad", tmp_path / "st", 12,
                      ["--sampler-head-only", "--sampler-head-state", "--lr", "3e-2"])) == 0
    assert "it gains a state, at zero" in capsys.readouterr().out
    assert json.loads((tmp_path / "st" / heads.CONFIG_NAME).read_text())["state"] is True
    logs = [json.loads(x) for x in (tmp_path / "st" / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in logs if "head_loss" in r]
    model, tok = sbd.load(tmp_path / "st")
    head = heads.head_of(model)
    assert head.carry is not None and head.carry.weight.any()  # the state trained away from zero
    prompts = [tok("count 3:").input_ids, tok("a b c").input_ids]
    base, _ = sbd.load(tmp_path / "model")
    ref = sbd.generate(base, tok, prompts, method="ntp", max_new_tokens=20)
    out, rec = _run(model, prompts)
    assert sbd.generate(model, tok, prompts, method="sbd-verify", max_new_tokens=20).token_ids == ref.token_ids
    again, _ = sbd.load(tmp_path / "st")
    assert _run(again, prompts)[1].ids == rec.ids  # the saved state drafts the same

    # a run that continues the state head keeps its state without the option
    assert main(_argv(tmp_path, tmp_path / "st", tmp_path / "st2", 2, ["--sampler-head-only"])) == 0
    assert json.loads((tmp_path / "st2" / heads.CONFIG_NAME).read_text())["state"] is True


def test_head_state_without_a_head_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n')
    argv = ["train", "--model", str(tmp_path), "--data", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "o"),
            "--adapter", "lora", "--sampler-head-state"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need --sampler-head" in err[0], err
    with pytest.raises(sbd.SBDError, match="state must be true or false"):
        heads.SamplerHeadConfig(state="yes")
