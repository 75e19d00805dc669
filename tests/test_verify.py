"""`method="sbd-verify"`: masked drafts checked by the model's own next-token head.

Exactness: greedy output equals `method="ntp"` token for token on every architecture, alone and in a
batch; sampling draws from NTP's distribution (checked against the exact distribution of a tiny model).
Cost: on a scripted model whose masked head is always right, a forward yields a whole block; when it
is never right, sbd-verify needs exactly NTP's forwards, never more.
"""

import itertools
from types import SimpleNamespace

import pytest
import torch
from conftest import random_prompts
from transformers import GenerationConfig, LlamaConfig

import sbd
from sbd.models import tiny

V, MASK, EOS = 32, 31, 2


class TwoHeadLM(torch.nn.Module):
    """A stand-in LM with scripted heads: at a causal position p it predicts `ntp[p + 1]` (the next
    token), at a mask token at position p it predicts `draft[p]` (a token, or {token: logit} to rank
    several). Everything depends on positions only, so the exact NTP output is `ntp[prompt_len:]` up
    to EOS."""

    def __init__(self, ntp, draft):
        super().__init__()
        self.config = LlamaConfig(vocab_size=V, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                  max_position_embeddings=256)
        self.config.sbd_mask_token_id = MASK
        self.generation_config = GenerationConfig(eos_token_id=EOS)
        self.embed = torch.nn.Embedding(V, 4)
        self.ntp, self.draft = ntp, draft

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, position_ids, attention_mask, past_key_values, use_cache=True, logits_to_keep=0):
        b, q = input_ids.shape
        past_key_values.update(torch.zeros(b, 1, q, 1), torch.zeros(b, 1, q, 1), 0)
        logits = torch.zeros(b, q, V)
        for i, j in itertools.product(range(b), range(q)):
            p = int(position_ids[i, j])
            token = self.draft(p) if int(input_ids[i, j]) == MASK else self.ntp(p + 1)
            for t, v in (token.items() if isinstance(token, dict) else [(token, 10.0)]):
                logits[i, j, t] = v
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def _script(p):
    return 3 + (p * 7) % 20  # never EOS, never the mask


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_perfect_drafts_fill_a_whole_block_per_forward(block_size):
    model = TwoHeadLM(_script, _script)
    out = sbd.generate(model, None, [[5, 6, 7]], method="sbd-verify", block_size=block_size, max_new_tokens=40,
                       eos_token_ids=[])
    assert out.token_ids[0] == [_script(p) for p in range(3, 43)]
    # the first forward has no draft yet (1 token); every later one keeps block_size - 1 drafts + 1 token
    assert out.nfe == [1 + -(-39 // block_size)]
    assert out.steps[0][:1 + block_size] == [1] + [2] * block_size


def test_leftover_draft_takes_the_refused_drafts_later_places():
    from sbd.decoding.proposers.chain import leftover_draft

    draft = [10, 11, 12, 13, 14]
    assert leftover_draft(draft, 1, 99) == [12, 13, 14]   # draft[1] replaced by 99: places 2.. stay
    assert leftover_draft(draft, 1, 12) == [13, 14]       # the model said draft[2] a place early: one too many
    assert leftover_draft(draft, 4, 99) == [] and leftover_draft([], 0, 5) == []


def test_a_refused_drafts_later_places_are_verified_next():
    from sbd.decoding.draft_policy import DraftOptions

    wrong_every_5th = lambda p: (4 if _script(p) != 4 else 5) if p % 5 == 0 else _script(p)  # noqa: E731
    model = TwoHeadLM(_script, wrong_every_5th)
    kw = dict(method="sbd-verify", block_size=8, max_new_tokens=40, eos_token_ids=[])
    assert DraftOptions().reuse_leftover is False  # off by default (measured worse on real drafts)
    fresh = sbd.generate(model, None, [[5, 6, 7]], **kw)
    reuse = sbd.generate(model, None, [[5, 6, 7]], draft_options=DraftOptions(reuse_leftover=True), **kw)
    want = [_script(p) for p in range(3, 43)]
    assert reuse.token_ids[0] == fresh.token_ids[0] == want
    # after a refusal at a multiple of 5, the old draft's later places (right) are kept in the next
    # forward instead of a forward with no draft
    assert reuse.nfe[0] < fresh.nfe[0]


def test_wrong_drafts_cost_exactly_ntp_forwards():
    model = TwoHeadLM(_script, lambda p: 4 if _script(p) != 4 else 5)
    out = sbd.generate(model, None, [[5, 6, 7]], method="sbd-verify", block_size=8, max_new_tokens=30,
                       eos_token_ids=[])
    assert out.token_ids[0] == [_script(p) for p in range(3, 33)]
    assert out.nfe == [30] and out.steps[0] == list(range(1, 31))
    assert out.mean_accepted == 0.0


def test_a_draft_wrong_at_one_position_keeps_its_prefix():
    # drafts right except at position 10: the forward verifying it keeps the drafts before 10, writes
    # NTP's token at 10, and the next forward drafts afresh.
    model = TwoHeadLM(_script, lambda p: 4 if p == 10 else _script(p))
    out = sbd.generate(model, None, [[5, 6, 7]], method="sbd-verify", block_size=4, max_new_tokens=16,
                       eos_token_ids=[])
    assert out.token_ids[0] == [_script(p) for p in range(3, 19)]
    # forward 1: token at 3 (+ drafts 4-6); 2: 4-6 kept + 7 (+ drafts 8-10); 3: 8, 9 kept, 10 corrected;
    # 4: 11 (+ drafts 12-14); 5: 12-14 + 15 (+ 16-18); 6: 16-18 (budget)
    assert out.steps[0] == [1, 2, 2, 2, 2, 3, 3, 3, 4, 5, 5, 5, 5, 6, 6, 6]
    assert out.accepted[0] == [0, 3, 2, 0, 3, 2]


def test_eos_inside_an_accepted_draft_ends_the_row_there():
    ntp = lambda p: EOS if p == 9 else _script(p)
    model = TwoHeadLM(ntp, ntp)
    out = sbd.generate(model, None, [[5, 6, 7]], method="sbd-verify", block_size=8, max_new_tokens=40)
    assert out.token_ids[0] == [_script(p) for p in range(3, 9)] + [EOS]
    assert out.nfe == [2]


def test_greedy_equals_ntp_alone_and_in_a_batch(model):
    prompts = random_prompts(5, model.config.vocab_size, seed=3)
    free = sbd.generate(model, None, prompts[:1], method="ntp", max_new_tokens=30, eos_token_ids=[])
    eos = [free.token_ids[0][9]]  # rows stop at different times
    ntp = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=30, eos_token_ids=eos)
    batch = sbd.generate(model, None, prompts, method="sbd-verify", block_size=4, max_new_tokens=30,
                         eos_token_ids=eos)
    assert len({len(t) for t in ntp.token_ids}) > 1
    assert batch.token_ids == ntp.token_ids
    for i, p in enumerate(prompts):
        alone = sbd.generate(model, None, [p], method="sbd-verify", block_size=4, max_new_tokens=30,
                             eos_token_ids=eos)
        assert alone.token_ids[0] == ntp.token_ids[i]
        assert alone.nfe[0] <= ntp.nfe[i]


def test_greedy_equals_ntp_on_a_trained_model_whose_drafts_are_often_right():
    """A random model's masked head is rarely right, so the accept-and-crop path runs on the shipped
    SBD-trained demo model: a real KV cache, drafts accepted, rejected and cropped, rows of a batch
    stopping at different times. Whole-block drafts: adaptive ones follow the step times of the machine
    (on a busy one they may rightly take plain steps), and this test is about the drafts' path, not their pace."""
    from sbd.tasks import make_split

    model, tok = sbd.load("demo")
    prompts = [ex["prompt"] for task in ("chain_sum", "number_sorting") for ex in make_split(task, "test", 3, 1)]
    ntp = sbd.generate(model, tok, prompts, method="ntp", max_new_tokens=64)
    for rows in (prompts, *([p] for p in prompts)):
        ver = sbd.generate(model, tok, rows, method="sbd-verify", block_size=8, draft="block", max_new_tokens=64)
        assert ver.token_ids == [ntp.token_ids[prompts.index(p)] for p in rows]
        assert ver.mean_accepted > 0.5
    assert sum(ver.nfe) < sum(ntp.nfe[-1:])


def test_sampling_follows_the_ntp_distribution():
    """Tokens 1-3 after a fixed prompt, sampled 1,500 times, against the exact NTP marginals."""
    cfg = tiny.tiny_config("llama", vocab_size=8, hidden=16, layers=1, heads=2, kv_heads=1, context=64)
    model = tiny.random_model(cfg, seed=4, logit_scale=1.0)
    model.config.sbd_mask_token_id = 7
    prompt = [1, 2, 3]
    exact = _exact_marginals(model, prompt, 3)
    n = 1500
    counts = torch.zeros(3, 8)
    accepted = 0
    for s in range(n):
        out = sbd.generate(model, None, [prompt], method="sbd-verify", block_size=4, max_new_tokens=3,
                           temperature=1.0, seed=s, eos_token_ids=[])
        for j, t in enumerate(out.token_ids[0]):
            counts[j, t] += 1
        accepted += sum(out.accepted[0])
    assert accepted > n / 4  # the acceptance path was taken
    tv = 0.5 * (counts / n - exact).abs().sum(-1)
    assert tv.max() < 0.06, tv  # sampling noise at n = 1,500 over 8 outcomes: TV ~ 0.02


def _exact_marginals(model, prompt, steps):
    """Marginal distribution of each of the next `steps` tokens under NTP sampling at temperature 1."""
    seqs = {tuple(prompt): 1.0}
    marginals = []
    with torch.no_grad():
        for _ in range(steps):
            nxt, m = {}, torch.zeros(model.config.vocab_size)
            for seq, w in seqs.items():
                p = torch.softmax(model(torch.tensor([seq])).logits[0, -1].float(), -1)
                m += w * p
                for t in range(len(p)):
                    nxt[seq + (t,)] = w * float(p[t])
            marginals.append(m)
            seqs = nxt
    return torch.stack(marginals)


def test_eb_drafts_are_exact_and_gamma_inf_is_the_whole_block(model):
    prompts = random_prompts(3, model.config.vocab_size, seed=7)
    ntp = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=20, eos_token_ids=[])
    block = sbd.generate(model, None, prompts, method="sbd-verify", block_size=4, max_new_tokens=20,
                         eos_token_ids=[])
    for gamma in (0.0, 0.5):
        eb = sbd.generate(model, None, prompts, method="sbd-verify", draft="eb", gamma=gamma, block_size=4,
                          max_new_tokens=20, eos_token_ids=[])
        assert eb.token_ids == ntp.token_ids
    full = sbd.generate(model, None, prompts, method="sbd-verify", draft="eb", gamma=float("inf"), block_size=4,
                        max_new_tokens=20, eos_token_ids=[])
    assert (full.token_ids, full.nfe, full.steps) == (block.token_ids, block.nfe, block.steps)


def test_eb_drafting_spends_its_own_forwards():
    # perfect drafts, γ = 0: each draft of block_size - 1 tokens is revealed one per forward, so a
    # block costs block_size - 2 drafting forwards (the first reveal rides in the verifying forward)
    model = TwoHeadLM(_script, _script)
    out = sbd.generate(model, None, [[5, 6, 7]], method="sbd-verify", draft="eb", gamma=0.0, block_size=4,
                       max_new_tokens=9, eos_token_ids=[])
    assert out.token_ids[0] == [_script(p) for p in range(3, 12)]
    # forward 1: token 1; drafting 2, 3; forward 4 keeps 3 drafts + 1; drafting 5, 6; forward 7: the rest
    assert out.nfe == [7] and out.steps[0] == [1, 4, 4, 4, 4, 7, 7, 7, 7]


@pytest.mark.parametrize("kw,match", [
    ({"method": "sbd", "draft": "eb"}, "sbd-verify"),
    ({"method": "sbd-verify", "draft": "eb", "temperature": 1.0}, "greedy only"),
    ({"method": "sbd-verify", "draft": "tree"}, "unknown draft"),
])
def test_draft_misuse_is_one_clear_error(llama, kw, match):
    with pytest.raises(sbd.SBDError, match=match):
        sbd.generate(llama, None, [[5, 6]], max_new_tokens=4, **kw)


def linear(c):
    return lambda w: 1 + c * (w - 1)


def test_best_draft_length_follows_acceptance_and_cost():
    from sbd.decoding.draft_lengths import best_draft_length

    assert best_draft_length(0.3, linear(0.04), 15) == 1  # drafts mostly refused: the narrowest draft
    assert best_draft_length(0.95, linear(0.0), 15) == 15  # free width: draft as far as allowed
    lengths = [best_draft_length(a, linear(0.05), 15) for a in (0.3, 0.5, 0.7, 0.8, 0.9, 0.97)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    assert best_draft_length(0.8, linear(0.2), 15) < best_draft_length(0.8, linear(0.02), 15)  # dearer width
    step = lambda w: 1.0 if w == 1 else 1.6 + 0.02 * w  # noqa: E731  (a CPU: 1 → 2 tokens is the big step)
    assert best_draft_length(0.25, step, 7) == 0  # no draft pays: plain next-token steps
    assert best_draft_length(0.8, step, 7) > 0


def test_a_refused_draft_is_priced_with_the_forward_that_restarts_drafting():
    """After a refusal the next forward has no draft and feeds its masks alone: a draft that is often
    refused must pay for that forward too (int4 SmolLM2's prices of steps with masks, measured)."""
    from sbd.decoding.draft_lengths import best_draft_length, expected_tokens

    measured = {1: 1.0, 2: 1.3, 3: 1.74, 4: 1.81, 5: 2.24, 6: 2.29, 7: 2.39, 8: 2.5}
    prices = lambda w: measured.get(w, 2.5 + 0.18 * (w - 8))  # noqa: E731
    assert expected_tokens(0.8, 3) / prices(8) > 1.0  # counted alone, a 3-token draft would look worth it
    assert best_draft_length(0.8, prices, 7) == 0  # with the restart it is not: plain steps
    assert best_draft_length(0.8, prices, 7, restart=False) == 3  # rows in one forward: not charged
    assert best_draft_length(0.97, prices, 7) >= 3  # drafts that nearly always stand still pay
    assert best_draft_length(0.8, lambda w: 1.0, 7) == 7  # free width: a restart costs one plain step only


def test_confident_length_stops_before_the_place_the_drafter_is_unsure_of():
    from sbd.decoding.draft_lengths import confident_length

    free, dear = linear(0.0), linear(0.3)
    assert confident_length([0.99] * 7, free, 8, 0.5) == 7  # sure all along, width free: all of it
    assert confident_length([0.99, 0.98, 0.1, 0.99, 0.99], free, 8, 0.5) == 2  # not the unsure place
    assert confident_length([0.99, 0.98, 0.1, 0.99, 0.99], free, 8, 0.0) == 5  # no refusal cost, free width
    assert confident_length([0.05, 0.9], free, 8, 0.5) == 0  # unsure at once: no draft, NTP's token
    assert confident_length([0.6] * 7, dear, 2, 0.5) == 2 < confident_length([0.6] * 7, free, 2, 0.5)  # dear width
    assert confident_length([], free, 8, 0.5) == 0
    lengths = [confident_length([p] * 7, linear(0.05), 8, 0.5) for p in (0.2, 0.5, 0.8, 0.95, 0.999)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]


def test_adaptive_drafts_cut_by_confidence_stay_exact(model, monkeypatch):
    """Free width: adaptive drafting feeds whole blocks; the drafter's confidence then shortens the drafts
    (with a refusal made dear: these models' logits are decisive, so their drafter is seldom unsure). The
    tokens stay NTP's, alone and in a batch, cut or not."""
    import importlib

    from sbd.decoding.draft_policy import DraftOptions

    g = importlib.import_module("sbd.decoding.generate")
    monkeypatch.setattr(g, "forward_costs", lambda m, batch=1: linear(0.0))
    prompts = random_prompts(4, model.config.vocab_size, seed=11)
    ntp = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=40)
    fed = {}
    for refusal in (None, 50.0):
        options = DraftOptions(refusal_cost=refusal)
        drafts = fed[refusal] = []  # row 0 alone, per forward: the draft tokens fed (committed part less the head)
        out = sbd.generate(model, None, prompts[:1], method="sbd-verify", draft="adaptive", block_size=8,
                           max_new_tokens=40, observer=lambda r: drafts.append(r.commits[0] - 1),
                           draft_options=options)
        batch = sbd.generate(model, None, prompts, method="sbd-verify", draft="adaptive", block_size=8,
                             max_new_tokens=40, draft_options=options)
        assert out.token_ids == ntp.token_ids[:1] and batch.token_ids == ntp.token_ids
        assert batch.nfe[0] == out.nfe[0] and batch.accepted[0] == out.accepted[0]  # batch = alone
    assert max(fed[None][1:]) == 7  # not cut: a draft after a fully kept one is the whole block's 7
    assert sum(fed[50.0][1:]) < sum(fed[None][1:])  # cut: fewer draft tokens put up


@pytest.mark.parametrize("cost", ["free", "dear", "never"])
def test_adaptive_drafts_are_exact_and_follow_the_cost(model, monkeypatch, cost):
    import importlib

    g = importlib.import_module("sbd.decoding.generate")  # the module, not the function of that name
    fn = {"free": linear(0.0), "dear": linear(0.5), "never": lambda w: 1.0 if w == 1 else 50.0}[cost]
    monkeypatch.setattr(g, "forward_costs", lambda m, batch=1: fn)
    prompts = random_prompts(4, model.config.vocab_size, seed=9)
    ntp = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=40)
    widths = []
    out = sbd.generate(model, None, prompts, method="sbd-verify", draft="adaptive", block_size=8, max_new_tokens=40,
                       observer=lambda r: widths.append(max(r.reals)))
    assert out.token_ids == ntp.token_ids
    if cost == "dear":  # from the third verifying forward on, every row drafts 1 token with 2 masks: ≤ 1 + 1 + 2
        assert max(widths[3:]) <= 4 and max(widths) > 4
    if cost == "never":  # plain next-token steps (width 1), but for a probe now and then
        assert widths[3:].count(1) > len(widths[3:]) // 2
    with pytest.raises(sbd.SBDError, match="applies to method='sbd-verify'"):
        sbd.generate(model, None, prompts, method="sbd", draft="adaptive")
    with pytest.raises(sbd.SBDError, match="greedy only"):
        sbd.generate(model, None, prompts, method="sbd-verify", draft="adaptive", temperature=1.0)
