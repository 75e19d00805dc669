"""The sampler head (`sbd.drafters.sampler_head`): drafts that see each other, never the output.

Decoding: the head's table walked on the host equals a plain left-to-right rescoring; with random
non-zero heads over random adapters, greedy sbd-verify still equals Hugging Face greedy on four
architectures (chain, tree, adaptive, lookup; batch = alone); the drafts fed are exactly the head's
rescoring of the previous forward (and differ from the masks' own); a zero (untrained) head and a
switched-off head change nothing; save → load gives the same drafts. Training: the training forward's
head logits equal lm_head(h + MLP([h; E(prev)])) by hand; one --sampler-head-only step moves the head
alone; the head's loss falls; bad option combinations are refused in one line.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import _model, attach_random_adapter, hf_greedy, random_prompts
from safetensors.torch import load_file

import sbd
from sbd.drafters import adapter as adapters
from sbd.decoding.proposers import head as head_drafts
from sbd.drafters import sampler_head as heads
from sbd.cli import main
from sbd.models import tiny

ARCHS = ["llama", "qwen2", "qwen3", "mistral"]


def attach_random_head(model, seed=0, scale=1.0, width=16, top_k=8):
    """A head with random non-zero weights (a fresh one is the identity), as sensitive to the previous
    token as to the hidden state (the random embeddings are ~50x smaller than the hidden states)."""
    head = heads.attach(model, heads.SamplerHeadConfig(width=width, top_k=top_k))
    try:
        g = torch.Generator().manual_seed(seed)  # drawn on the CPU: the same head on every device
        emb = model.get_input_embeddings().weight
        with torch.no_grad():
            for p in head.parameters():
                p.copy_(torch.randn(p.shape, generator=g, device="cpu") * scale / p.shape[-1] ** 0.5)
            head.up.weight[:, emb.shape[1]:] /= emb.std()
    except BaseException:
        heads.detach(model)  # not half made and left behind on a shared model
        raise
    return head


def naive_chain(model, head, hidden, logits, first, top_k, probs=False):
    """The head's greedy drafts one position after the other, straight from the definition; probs: also
    each pick's probability under the head's softmax over the masks' top-k candidates."""
    emb, out = model.get_input_embeddings().weight, model.get_output_embeddings()
    picks, prev, chances = [], int(first), []
    for i in range(hidden.shape[0]):
        x = torch.cat([hidden[i], emb[prev]])
        h2 = hidden[i] + head.down.weight @ F.silu(head.up.weight @ x + head.up.bias)
        cand = logits[i].topk(top_k).indices
        scores = out(h2)[cand]
        prev = int(cand[scores.argmax()])
        picks.append(prev)
        chances.append(float(scores.softmax(-1).max()))
    return (picks, chances) if probs else picks


def random_positions(model, m, draws=20, seed=2):
    """`draws` random final hidden states for m draft positions, each with the model's logits for them."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(draws):
        hidden = torch.randn(m, model.config.hidden_size, generator=g, device="cpu").to(model.device)
        yield hidden, model.get_output_embeddings()(hidden)


class Recorder:
    """Every forward's input ids (row 0) and the output layer's input (what the head reads)."""

    def __init__(self, model):
        self.ids, self.logits, self.hidden = [], [], []
        self.handle = model.get_output_embeddings().register_forward_pre_hook(
            lambda m, args: self.hidden.append(args[0][0].detach().clone()))

    def __call__(self, record):
        self.ids.append(record.input_ids[0].tolist())
        self.logits.append(record.logits[0].detach().clone())

    def close(self):
        self.handle.remove()


def _run(model, prompts, **kw):
    rec = Recorder(model)
    try:
        out = sbd.generate(model, None, prompts, method="sbd-verify", block_size=5, max_new_tokens=24,
                           observer=rec, **kw)
    finally:
        rec.close()
    return out, rec


# -- the table and its walk -------------------------------------------------------------------------------
@pytest.mark.parametrize("top_k", [1, 3, 8])
def test_table_walk_equals_left_to_right_rescoring(top_k):
    model = _model("qwen2")
    head = attach_random_head(model, seed=1, scale=3.0, top_k=top_k)
    try:
        changed = 0
        for hidden, logits in random_positions(model, 6):
            with torch.no_grad():
                values = head_drafts.draft_table(head, model, hidden, logits, torch.tensor(7, device=model.device)).tolist()
                want = naive_chain(model, head, hidden, logits, 7, top_k)
            assert head_drafts.walk(values, 6) == want
            changed += want != logits.argmax(-1).tolist()
            with torch.no_grad():  # with the head's probability of every pick (adaptive drafting cuts by it)
                first = torch.tensor(7, device=model.device)
                with_p = head_drafts.draft_table(head, model, hidden, logits, first, probs=True).tolist()
                _, want_p = naive_chain(model, head, hidden, logits, 7, top_k, probs=True)
            chain, chances = head_drafts.walk(with_p, 6, probs=True)
            assert chain == want and chances == pytest.approx(want_p, abs=1e-5)
            assert top_k > 1 or chances == [1.0] * 6
        assert changed if top_k > 1 else not changed  # the head rescored something (top_k 1: nothing to choose)
        assert head_drafts.walk([], 0) == [] and head_drafts.walk([], 0, probs=True) == ([], [])
    finally:
        heads.detach(model)


def test_the_table_reads_a_bfloat16_models_tables_with_a_float32_head():
    """vLLM serves bfloat16 weights by default; the head stays float32: the table takes the model's rows as
    the head's dtype (it refused with a dtype error before). A private model: a round trip through bfloat16
    rounds the embeddings, which a shared model must never keep."""
    model = _model.__wrapped__("qwen2")
    head = attach_random_head(model, seed=1, scale=3.0, top_k=3)
    try:
        g = torch.Generator().manual_seed(2)
        hidden = torch.randn(4, model.config.hidden_size, generator=g, device="cpu").to(model.device)
        logits = model.get_output_embeddings()(hidden)
        with torch.no_grad():
            want = head_drafts.draft_table(head, model, hidden, logits, torch.tensor(7, device=model.device))
            model.get_input_embeddings().to(torch.bfloat16)
            got = head_drafts.draft_table(head, model, hidden.bfloat16(), logits, torch.tensor(7, device=model.device))
        assert got.shape == want.shape and got[:12].tolist() == want[:12].tolist()  # the same candidates
    finally:
        model.get_input_embeddings().to(torch.float32)
        heads.detach(model)


# -- exactness ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_random_head_keeps_hugging_face_greedy_and_batch_equals_alone(arch, cheap_width, monkeypatch):
    from sbd.decoding.rows import VerifyRow
    from sbd.decoding.tree_rows import TreeRow

    feeds = {}  # prompt -> every feed of its row, in order

    def recorded(real):
        def feed(row):
            f = real(row)
            feeds.setdefault(tuple(row.prompt), []).append((f.tokens, f.parents))
            return f
        return feed

    monkeypatch.setattr(TreeRow, "feed", recorded(TreeRow.feed))  # before VerifyRow's: a tree's prefill calls it
    monkeypatch.setattr(VerifyRow, "feed", recorded(VerifyRow.feed))
    model = _model(arch)
    base = random_prompts(4, model.config.vocab_size, seed=31)
    prompts = base[:2] + [p + p for p in base[2:]]  # two repeat themselves: lookup finds chains
    refs = [hf_greedy(model, p, 24) for p in prompts]
    attach_random_adapter(model, seed=6)
    attach_random_head(model, seed=7, scale=3.0)
    try:
        for kw in ({}, dict(tree=(3, 2)), dict(draft="adaptive", lookup=True), dict(tree="2,2", lookup=True)):
            feeds.clear()
            out = sbd.generate(model, None, prompts, method="sbd-verify", block_size=5, max_new_tokens=24, **kw)
            assert out.token_ids == refs, kw
            batch_feeds = dict(feeds)
            for i, p in enumerate(prompts):
                feeds.clear()
                alone = sbd.generate(model, None, [p], method="sbd-verify", block_size=5, max_new_tokens=24, **kw)
                assert (alone.token_ids[0], alone.nfe[0], alone.accepted[0]) == \
                    (out.token_ids[i], out.nfe[i], out.accepted[i]), kw
                assert feeds[tuple(p)] == batch_feeds[tuple(p)], kw  # the same drafts, forward by forward
    finally:
        heads.detach(model)
        adapters.detach(model)


# -- what the head drafts ------------------------------------------------------------------------------------
def test_drafts_are_the_heads_rescoring_of_the_previous_forward():
    """After a forward whose draft stood whole, the next forward feeds exactly the head's left-to-right
    rescoring of that forward's masks (recomputed from the recorded hidden states); in some forwards it
    differs from the masks' own argmax, so a head that is never called fails."""
    model = _model("llama", seed=3)
    attach_random_adapter(model, seed=8)
    head = attach_random_head(model, seed=9, scale=3.0)
    mask = model.config.sbd_mask_token_id
    try:
        prompts = random_prompts(3, model.config.vocab_size, lengths=(4, 9, 2), seed=32)
        checked = differs = 0
        for p in prompts:
            out, rec = _run(model, [p], eos_token_ids=[])
            for t in range(1, len(rec.ids) - 1):  # record 0 is the prefill
                ids = rec.ids[t]
                n_masks = ids.count(mask)
                n = len(ids) - n_masks - 1
                if out.accepted[0][t - 1] != n or n_masks < 2:
                    continue  # the next draft comes from a refused draft's leftover, or there is none
                logits = rec.logits[t].clone()
                logits[:, mask] = torch.finfo(logits.dtype).min
                first = logits[n].argmax()
                with torch.no_grad():
                    want = naive_chain(model, head, rec.hidden[t][n + 2:], logits[n + 2:], first, 8)
                nxt = rec.ids[t + 1]
                fed = nxt[1 : len(nxt) - nxt.count(mask)]
                if not fed and t + 1 == len(rec.ids) - 1:
                    continue  # the last forward: the budget left no room for a draft
                assert fed == want[: len(fed)] and len(fed) > 0
                checked += 1
                differs += want != logits[n + 2:].argmax(-1).tolist()
        assert checked >= 3 and differs >= 1
        # and the drafts differ from a run without the head
        with heads.enabled(model, False):
            plain, rec_plain = _run(model, prompts[:1], eos_token_ids=[])
        mine, rec_mine = _run(model, prompts[:1], eos_token_ids=[])
        assert plain.token_ids == mine.token_ids and rec_plain.ids != rec_mine.ids
    finally:
        heads.detach(model)
        adapters.detach(model)


def _row_forward(model, row, first_token, seed):
    """One verifying forward of `row` on made-up logits: the next-token head keeps the whole draft (chain
    or the tree's main chain) and then says `first_token`; the masks' logits are lm_head of random hidden
    states. Returns the masks' hidden states and logits after the first mask (what the next draft reads)."""
    feed = row.feed()
    tokens, n_commit = feed.tokens, feed.n_commit
    parents = feed.parents or list(range(-1, n_commit - 1))
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(len(tokens), model.config.hidden_size, generator=g, device="cpu").to(model.device)
    with torch.no_grad():
        logits = model.get_output_embeddings()(hidden)
    main = [n_commit - 1]  # the main chain: the last node and its ancestors
    while parents[main[-1]] >= 0:
        main.append(parents[main[-1]])
    main = main[::-1]
    for i in range(n_commit):  # the next-token head: along the main chain, then first_token
        nxt = tokens[main[main.index(i) + 1]] if i in main[:-1] else first_token if i == main[-1] else 3
        logits[i] = -10.0
        logits[i, nxt] = 10.0
    masks = logits[n_commit + 1:].clone()
    masks[:, model.config.sbd_mask_token_id] = torch.finfo(masks.dtype).min
    values = row.ask(logits, drafting=head_drafts.Drafting(heads.head_of(model), model, hidden))
    row.answer(values.tolist())
    return hidden[n_commit + 1:], masks


@pytest.mark.parametrize("tree", [None, (2,)])
def test_a_row_drafts_from_the_token_the_masks_follow(tree):
    """Row level, with a draft that stands whole (random models rarely draft right): the next draft is
    the head's left-to-right rescoring of the masks, starting from the next-token head's token after the
    draft, not the draft's own first token."""
    from sbd.decoding.kinds import make_row
    from sbd.decoding.spec import DecodeSpec

    model = _model("llama", seed=6)
    head = attach_random_head(model, seed=20, scale=3.0)
    mask = model.config.sbd_mask_token_id
    try:
        differs = 0
        for seed in range(6):
            row = make_row(DecodeSpec(block_size=5, max_new_tokens=40, tree=tree), [9], mask_id=mask)
            row.draft = [11, 12, 13]
            if tree is not None:
                row.branches = [[14], [11, 15]]
            hidden, masks = _row_forward(model, row, first_token=17, seed=seed)
            with torch.no_grad():
                want = naive_chain(model, head, hidden, masks, 17, 8)
            assert row.out == [11, 12, 13, 17] and row.head == 17
            assert row.draft == want
            differs += want != masks.argmax(-1).tolist()
        assert differs
    finally:
        heads.detach(model)


@pytest.mark.parametrize("kw", [{}, dict(tree=(3, 2)), dict(lookup=True, draft="adaptive")])
def test_an_untrained_head_or_a_switched_off_one_changes_nothing(kw, cheap_width):
    model = _model("qwen3", seed=2)
    attach_random_adapter(model, seed=10)
    prompts = random_prompts(3, model.config.vocab_size, seed=33)
    try:
        plain, rec_plain = _run(model, prompts, **kw)
        heads.attach(model, heads.SamplerHeadConfig(width=8))  # down is zero: the identity
        zero, rec_zero = _run(model, prompts, **kw)
        assert rec_zero.ids == rec_plain.ids and zero.accepted == plain.accepted
        heads.detach(model)
        attach_random_head(model, seed=11, scale=3.0)
        with heads.enabled(model, False):
            off, rec_off = _run(model, prompts, **kw)
        assert rec_off.ids == rec_plain.ids and off.accepted == plain.accepted
        on, rec_on = _run(model, prompts, **kw)
        assert on.token_ids == plain.token_ids and rec_on.ids != rec_plain.ids
    finally:
        heads.detach(model)
        adapters.detach(model)


def test_head_chains_cut_by_the_heads_confidence_stay_exact(cheap_width):
    """DraftOptions.cut_head_chains (off by default): adaptive drafts of the head's chain cut by the head's
    probability of each pick, with a refusal made dear so that cuts happen; the tokens stay greedy."""
    from sbd.decoding.draft_policy import DraftOptions

    model = _model("llama", seed=4)
    prompts = random_prompts(3, model.config.vocab_size, seed=35)
    want = [hf_greedy(model, p, 24) for p in prompts]  # the base model's, before adapter and head
    attach_random_adapter(model, seed=13)
    attach_random_head(model, seed=14, scale=3.0)
    try:
        fed = {}
        for cut in (False, True):
            out, rec = _run(model, prompts, draft="adaptive",
                            draft_options=DraftOptions(cut_head_chains=cut, refusal_cost=50.0))
            assert out.token_ids == want
            fed[cut] = rec.ids
        assert fed[True] != fed[False]  # the cut changed the drafts fed
    finally:
        heads.detach(model)
        adapters.detach(model)


def test_sampling_never_uses_the_head():
    """temperature > 0: the draft must be drawn from the masks' own distribution (the acceptance rule
    divides by it), so a seeded sample is the same with and without a head."""
    model = _model("mistral")
    attach_random_adapter(model, seed=12)
    prompts = random_prompts(2, model.config.vocab_size, seed=34)
    try:
        kw = dict(method="sbd-verify", block_size=4, max_new_tokens=16, temperature=1.0, seed=3)
        plain = sbd.generate(model, None, prompts, **kw)
        attach_random_head(model, seed=13, scale=3.0)
        withhead = sbd.generate(model, None, prompts, **kw)
        assert (withhead.token_ids, withhead.accepted) == (plain.token_ids, plain.accepted)
    finally:
        heads.detach(model)
        adapters.detach(model)


# -- files ----------------------------------------------------------------------------------------------------
def test_save_load_round_trip_and_the_load_switch(tmp_path):
    tiny.create(tmp_path / "model", vocab_size=300, hidden=32, layers=2, heads=4, kv_heads=2, context=128)
    model, tok = sbd.load(tmp_path / "model")
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(100.0)  # decisive logits, as in conftest
    model.save_pretrained(tmp_path / "model")
    model, tok = sbd.load(tmp_path / "model")
    attach_random_adapter(model, seed=14)
    adapters.adapter_of(model).config.base_model_name_or_path = str(tmp_path / "model")
    attach_random_head(model, seed=15, scale=3.0, width=12, top_k=5)
    adapters.save(model, tmp_path / "ad")
    heads.save(model, tmp_path / "ad")
    assert json.loads((tmp_path / "ad" / heads.CONFIG_NAME).read_text())["width"] == 12
    prompts = random_prompts(3, model.config.vocab_size, seed=35)
    ref_out, ref = _run(model, prompts)
    with heads.enabled(model, False):
        off_out, off = _run(model, prompts)
    assert ref.ids != off.ids

    loaded, _ = sbd.load(tmp_path / "ad")  # the adapter folder names its base; its head comes along
    assert heads.head_of(loaded).config.top_k == 5
    out, rec = _run(loaded, prompts)
    assert rec.ids == ref.ids and out.accepted == ref_out.accepted
    bare, _ = sbd.load(tmp_path / "ad", sampler_head=False)
    assert heads.head_of(bare) is None
    out, rec = _run(bare, prompts)
    assert rec.ids == off.ids and out.accepted == off_out.accepted and out.token_ids == ref_out.token_ids

    (tmp_path / "ad" / heads.WEIGHTS_NAME).write_bytes(b"garbage")
    with pytest.raises(sbd.SBDError, match="damaged or unreadable"):
        sbd.load(tmp_path / "ad")


# -- training ---------------------------------------------------------------------------------------------------
def _batch(model, tok, k=4, seed=0):
    from sbd.training.collator import SBDDataCollator

    c = SBDDataCollator(tok, mask_token_id=model.config.sbd_mask_token_id, block_size=k, seed=seed)
    g = torch.Generator().manual_seed(seed)
    feats = [{"input_ids": torch.randint(3, model.config.vocab_size, (n,), generator=g, device="cpu").tolist()
              + [tok.eos_token_id]}
             for n in (13, 7, 10)]
    clean = c.pad(feats)
    m = c.noisy_length(clean, k)
    eta, u = c.draw_noise(len(feats), m, g)
    batch = c.corrupt(clean, k, eta, u)
    n = batch["num_clean"]
    batch["labels"][:, :n] = -100
    return clean, batch, c.previous_tokens(clean, k), c.sources(clean, k)


def head_training_forward(model, tok, k):
    """The training forward's head terms on a small batch (`head_batch`: logits, targets, use) and, by hand,
    the plain doubled forward's final hidden states (B, T, H), with the gate at the clean length."""
    from sbd.training.adapter_forward import adapter_logits
    from sbd.training.head_loss import head_batch

    clean, batch, prev, src = _batch(model, tok, k)
    n, labels = batch["num_clean"], batch["labels"].to(model.device)
    inputs = {key: batch[key].to(model.device) for key in ("input_ids", "position_ids", "attention_mask")}
    prev = prev.to(model.device)
    with torch.no_grad():
        out = adapter_logits(model, inputs, labels, n, with_hidden=True)
        logits, target, use = head_batch(model, out, labels, n, prev)
        with heads.capture_output_input(model) as box, adapters.gated(model, n):
            model(**inputs, use_cache=False)
    return clean, batch, prev, src, (logits, target, use), box[0]


def test_training_head_logits_equal_the_definition_by_hand(tokenizer):
    model = _model("qwen2", seed=4)
    attach_random_adapter(model, seed=16)
    head = attach_random_head(model, seed=17, scale=3.0)
    try:
        k = 4
        clean, batch, prev, src, (logits, target, use), hidden = head_training_forward(model, tokenizer, k)
        n, labels = batch["num_clean"], batch["labels"]
        rows = (labels[:, n:] != -100).nonzero().tolist()
        assert int(use.sum()) == sum(j % k > 0 for _, j in rows) > 5
        ids, emb = clean["input_ids"], model.get_input_embeddings().weight
        at = 0
        for (b, j), used in zip(rows, use.tolist()):
            if not used:
                assert j % k == 0
                continue
            s = int(src[b, j - 1])  # the true token before: x at the previous place (EOS for padding)
            p = int(ids[b, s]) if s >= 0 else tokenizer.eos_token_id
            assert p == int(prev[b, j])
            h = hidden[b, n + j]
            h2 = h + head.down.weight @ F.silu(head.up.weight @ torch.cat([h, emb[p]]) + head.up.bias)
            want = model.get_output_embeddings()(h2)
            torch.testing.assert_close(logits[at], want, atol=1e-4, rtol=1e-4)
            assert int(target[at]) == int(labels[b, n + j])
            at += 1
    finally:
        heads.detach(model)
        adapters.detach(model)


COUNTS = [" ".join(str(i) for i in range(s, s + 9)) for s in range(40)]


def _setup(root):
    model, _ = tiny.create(root / "model", texts=COUNTS + tiny.SAMPLE_TEXT, vocab_size=260, hidden=48, layers=2,
                           heads=4, kv_heads=2, context=128)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(30.0)
    model.save_pretrained(root / "model")
    with open(root / "toy.jsonl", "w") as f:
        for s in range(40):
            f.write(json.dumps({"prompt": f"count {s}:", "completion": " " + COUNTS[s]}) + "\n")


def _argv(root, model, out, steps, extra=()):
    return ["train", "--model", str(model), "--data", str(root / "toy.jsonl"), "--out", str(out),
            "--adapter", "lora", "--rank", "4", "--steps", str(steps), "--batch-size", "16", "--lr", "1e-2",
            "--warmup-steps", str(min(2, steps - 1)), "--logging-steps", "2", "--save-steps", "100", "--block-size", "4",
            "--align-to-completion", "--no-progress", *extra]


def test_one_head_only_step_moves_the_head_alone(tokenizer, tmp_path):
    from sbd.training.collator import SBDDataCollator
    from sbd.training.trainer import SBDTrainer, sbd_training_args

    model = _model("llama", seed=5)
    attach_random_adapter(model, seed=18)
    heads.attach(model, heads.SamplerHeadConfig(width=8))
    model.requires_grad_(False)
    adapters.adapter_of(model).requires_grad_(True)  # as a trainable adapter: the trainer must keep it still
    try:
        g = torch.Generator().manual_seed(0)
        data = [{"input_ids": torch.randint(3, 300, (12,), generator=g, device="cpu").tolist()
                 + [tokenizer.eos_token_id],
                 "prompt_length": 0} for _ in range(8)]
        before = {k: v.clone() for k, v in model.state_dict().items()}
        args = sbd_training_args(tmp_path / "o", steps=1, batch_size=4, lr=1e-2, warmup_steps=0, save_steps=100)
        collator = SBDDataCollator(tokenizer, mask_token_id=model.config.sbd_mask_token_id, block_size=4)
        trainer = SBDTrainer(model, args, data_collator=collator, train_dataset=data, processing_class=tokenizer, mode="adapter", sampler_head="only",
                             show_progress=False)
        trainer.train()
        after = model.state_dict()
        moved = [k for k in before if not torch.equal(before[k], after[k])]
        assert moved and all(k.startswith("sbd_sampler_head.") for k in moved)
        assert "sbd_sampler_head.down.weight" in moved  # the zero start moved
    finally:
        heads.detach(model)
        adapters.detach(model)


def test_head_only_run_lowers_the_head_loss_and_keeps_the_adapter(tmp_path, capsys):
    _setup(tmp_path)
    assert main(_argv(tmp_path, tmp_path / "model", tmp_path / "ad", 6)) == 0
    assert main(_argv(tmp_path, tmp_path / "ad", tmp_path / "hd", 24,
                      ["--sampler-head-only", "--sampler-head-width", "32", "--lr", "3e-2"])) == 0
    assert "training a sampler head over the drafting adapter" in capsys.readouterr().out
    a = load_file(str(tmp_path / "ad" / adapters.WEIGHTS_NAME))
    b = load_file(str(tmp_path / "hd" / adapters.WEIGHTS_NAME))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    logs = [json.loads(x) for x in (tmp_path / "hd" / "metrics.jsonl").read_text().splitlines()]
    head = [r["head_loss"] for r in logs if "head_loss" in r]
    assert len(head) >= 5 and head[-1] < 0.9 * head[0]
    assert head[0] == pytest.approx([r["head_base_loss"] for r in logs if "head_loss" in r][0], rel=1e-4)  # zero start
    model, tok = sbd.load(tmp_path / "hd")
    assert heads.head_of(model).config.width == 32
    prompt = tok("count 3:").input_ids
    base, _ = sbd.load(tmp_path / "model")
    ref = sbd.generate(base, tok, [prompt], method="ntp", max_new_tokens=20)
    assert sbd.generate(model, tok, [prompt], method="sbd-verify", max_new_tokens=20).token_ids == ref.token_ids

    # joint training continues the head; a run without --sampler-head leaves it behind
    assert main(_argv(tmp_path, tmp_path / "hd", tmp_path / "jt", 4, ["--sampler-head"])) == 0
    assert "continuing the sampler head" in capsys.readouterr().out
    assert heads.has_head(tmp_path / "jt")
    assert main(_argv(tmp_path, tmp_path / "hd", tmp_path / "no", 2)) == 0
    assert "is not carried over" in capsys.readouterr().out and not heads.has_head(tmp_path / "no")


@pytest.mark.parametrize("extra, words", [
    (["--sampler-head"], "--adapter runs only"),
    (["--adapter", "lora", "--sampler-head", "--sampler-head-only"], "choose one of"),
    (["--adapter", "lora", "--sampler-head-width", "8"], "need --sampler-head"),
    (["--adapter", "lora", "--sampler-head", "--sampler-head-width", "0"], "--sampler-head-width must be"),
    (["--adapter", "lora", "--sampler-head-only", "--kl-weight", "1"], "trains no adapter"),
    (["--adapter", "lora", "--sampler-head-only", "--sampler-head-weight", "2"], "no masked loss"),
])
def test_bad_head_options_are_refused_in_one_line(tmp_path, capsys, extra, words):
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n')
    argv = ["train", "--model", str(tmp_path), "--data", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "o"),
            *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_head_only_over_a_fresh_adapter_is_refused(tmp_path, capsys):
    _setup(tmp_path)
    assert main(_argv(tmp_path, tmp_path / "model", tmp_path / "o", 2, ["--sampler-head-only"])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "give the adapter's folder as --model" in err[0]


def test_a_head_that_does_not_fit_leaves_the_model_as_it_was(tmp_path):
    """The head is built and filled before it hangs: a refused one is not left on the model half-loaded."""
    model, other = _model("llama", seed=6), _model("llama", seed=7)
    try:
        attach_random_head(model, seed=3, scale=1.0, width=12)
        heads.save(model, tmp_path)
        config = json.loads((tmp_path / heads.CONFIG_NAME).read_text())
        (tmp_path / heads.CONFIG_NAME).write_text(json.dumps({**config, "width": 8}))  # the tensors are 12 wide
        with pytest.raises(sbd.SBDError, match="does not fit"):
            heads.load(other, tmp_path)
        assert heads.head_of(other) is None
        (tmp_path / heads.CONFIG_NAME).write_text(json.dumps(config))
        assert heads.load(other, tmp_path).config.width == 12  # the slot is free: the right head goes on
    finally:
        heads.detach(model)
        heads.detach(other)
