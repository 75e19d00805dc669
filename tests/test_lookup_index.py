"""Prompt lookup as long as the match goes on (`lookup_max`), from an incremental index, with no masks
beside a lookup draft (issue 28).

The index gives the drafts of the plain scan it replaced (the scan is kept here as the oracle), on
random and repetitive sequences grown a few tokens at a time. A forward verifying a lookup draft feeds
no masks; any other feeds them as before. Exactness: greedy output equals Hugging Face greedy on every
architecture, with and without a drafting adapter, on prompts where lookup drafts (and has accepted)
more than block − 1 tokens; a row alone equals itself in a batch; chains, trees and adaptive drafting.
"""

import random

import pytest
import torch
from conftest import ARCHS, _model, attach_random_adapter, hf_greedy, random_prompts
from test_lookup import _cycle
from test_verify import MASK, TwoHeadLM

import sbd
from sbd.drafters import adapter as adapters
from sbd.decoding import trees
from sbd.decoding.engine import Engine
from sbd.decoding.proposers import lookup
from sbd.decoding.proposers.lookup import LookupIndex
from sbd.decoding.kinds import make_row
from sbd.decoding.rows import VerifyRow
from sbd.decoding.spec import DecodeSpec


def scan_lookup(seq, cap, ngrams=(3, 2)):
    """The oracle: the old per-forward scan. The latest earlier occurrence of the last 3 (else 2)
    tokens (the tail itself is no match); what follows it up to the end of `seq`, repeated, `cap` long."""
    for g in ngrams:
        if len(seq) <= g:
            continue
        tail = seq[-g:]
        for s in range(len(seq) - g - 1, -1, -1):
            if seq[s : s + g] == tail:
                period = len(seq) - s - g
                return [seq[s + g + i % period] for i in range(cap)]
    return []


def _grown(prompt, tokens, cap, rng):
    """A lookup row whose output grows by 1-5 tokens at a time (as verifying forwards commit them); the
    row's lookup and the oracle after every growth."""
    row = VerifyRow(DecodeSpec(block_size=4, lookup=True, lookup_max=cap, max_new_tokens=len(tokens) + 1), prompt, mask_id=MASK)
    got, want = [row.lookup_index.find(row.out, cap)], [scan_lookup(list(prompt), cap)]
    shared = [lookup.draft(list(prompt), cap)]  # the rule as the vLLM plug-in calls it
    while len(row.out) < len(tokens):
        row.out += tokens[len(row.out) : len(row.out) + rng.randint(1, 5)]
        got.append(row.lookup_index.find(row.out, cap))
        want.append(scan_lookup(row.prompt + row.out, cap))
        shared.append(lookup.draft(row.prompt + row.out, cap))
    assert shared == want
    return got, want


@pytest.mark.parametrize("alphabet", [2, 3, 5, 40])
def test_the_index_drafts_what_the_scan_drafted(alphabet):
    rng = random.Random(alphabet)
    for trial in range(40):
        prompt = [rng.randrange(alphabet) for _ in range(rng.randint(1, 12))]
        if trial % 2:  # repetitive: loops of a few tokens with some noise
            loop = [rng.randrange(alphabet) for _ in range(rng.randint(1, 6))]
            tokens = [loop[i % len(loop)] if rng.random() < 0.9 else rng.randrange(alphabet) for i in range(60)]
        else:
            tokens = [rng.randrange(alphabet) for _ in range(60)]
        got, want = _grown(prompt, tokens, rng.choice([1, 3, 16, 40]), rng)
        assert got == want
    assert any(want)  # matches were found (an empty oracle would prove nothing)


def test_the_index_keeps_the_scans_rules():
    def lookup(seq, cap=16):
        got = LookupIndex(seq).find([], cap)
        assert got == scan_lookup(seq, cap)
        return got

    assert lookup([7, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 9, 9, 1, 2, 3], 5) == [9, 9, 1, 2, 3]  # the latest of two
    assert lookup([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3], 6) == [4, 5, 6, 7, 8, 9]  # as long as it goes on
    assert lookup([1, 2, 3]) == [] and lookup([4, 5]) == []  # the tail itself is no match
    assert lookup([1, 1, 1]) == [1] * 16  # an overlapping match: the repeat, bounded by the cap
    assert lookup([1, 2, 3, 1, 2, 3], 40) == [1, 2, 3] * 13 + [1]  # the repeat is bounded by the cap, not 3
    assert lookup([1, 2, 3, 7, 5, 2, 3, 8, 1, 2, 3], 3) == [7, 5, 2]  # a 3-gram match beats a later 2-gram one


def test_the_index_reads_each_token_once():
    """The index is brought up to date with the newly committed tokens only (no scan of the whole
    sequence): every start position is indexed once per n-gram size, however many forwards look up."""

    class Counting(dict):
        sets = 0

        def __setitem__(self, key, value):
            Counting.sets += 1
            super().__setitem__(key, value)

    row = VerifyRow(DecodeSpec(block_size=4, lookup=True, max_new_tokens=100), list(range(3, 203)), mask_id=MASK)
    index = row.lookup_index
    index.index = {g: Counting() for g in index.index}
    index.find(row.out, 16)
    assert Counting.sets == 197 + 198  # every start but the tail's, for 3- and 2-grams
    for step in range(30):
        row.out += [5] * (step % 3)
        index.find(row.out, 16)
    n = len(row.prompt) + len(row.out)
    assert Counting.sets == (n - 3) + (n - 2) and len(index.seq) == n
    assert index.index[2][(5, 5)] == n - 3  # the latest start before the tail's


# -- masks only where they can be used ------------------------------------------------------------------
def _masks_per_forward(model, prompt, **kw):
    fed = []

    def observer(rec):
        fed.append(int((rec.input_ids[0, -rec.reals[0]:] == MASK).sum()))

    out = sbd.generate(model, None, [prompt], method="sbd-verify", observer=observer, **kw)
    return out, fed[1:] if len(prompt) > 1 else fed  # the first record: the prefill


@pytest.mark.parametrize("tree", [None, (2, 2)])
def test_a_forward_verifying_a_lookup_draft_feeds_no_masks(tree):
    model = TwoHeadLM(_cycle, lambda p: {20: 10.0, 21: 9.0})  # the masks never draft the right token
    kw = dict(block_size=8, max_new_tokens=40, eos_token_ids=[], lookup=True, tree=tree)
    out, masks = _masks_per_forward(model, [5, 6, 7], **kw)
    assert out.token_ids[0] == [_cycle(p) for p in range(3, 43)] and len(masks) == out.nfe[0] == 9
    # output 6 7 3 4 5 6 7 3 …: forwards 1-2 find no match (the masks draft); 3 matches [6, 7] (a wrong
    # loop: no masks); 4-6 find none; 7 matches [5, 6] in the prompt, 8-9 the cycle (test_lookup)
    assert masks == [8, 8, 0, 8, 8, 8, 0, 0, 0]
    assert out.accepted[0] == [0, 0, 0, 0, 0, 0, 1, 16, 14]
    assert sorted(set(out.steps[0])) == list(range(1, out.nfe[0] + 1))  # every forward yields a token


def test_a_forward_after_a_maskless_one_yields_a_token_when_lookup_then_finds_nothing():
    # the cycle, then tokens never seen from position 25 on: the lookup draft ending at 24 stands whole
    # and NTP's bonus token leaves the cycle; lookup then finds nothing and the forward before fed no
    # masks, so the next forward has no draft: it still yields NTP's token (and feeds masks again)
    ntp = lambda p: _cycle(p) if p < 25 else 8 + (p - 25)  # noqa: E731
    model = TwoHeadLM(ntp, lambda p: 20)
    out, masks = _masks_per_forward(model, [5, 6, 7], block_size=4, max_new_tokens=30, eos_token_ids=[],
                                    lookup=True, lookup_max=4)
    assert out.token_ids[0] == [ntp(p) for p in range(3, 33)]
    i = next(i for i, p in enumerate(range(3, 33)) if p == 25)  # the bonus token that leaves the cycle
    f = out.steps[0][i]  # … made by forward f, which verified a whole 4-token lookup draft without masks
    assert out.accepted[0][f - 1] == 4 and masks[f - 1] == 0
    assert out.accepted[0][f] == 0 and out.steps[0].count(f + 1) == 1 and masks[f] == 4
    assert sorted(set(out.steps[0])) == list(range(1, out.nfe[0] + 1))  # every forward yields a token


# -- adaptive drafting: lookup drafts as long as lookup's own record says pays --------------------------
def test_best_lookup_length_follows_lookups_record_and_the_cost_of_width():
    from sbd.decoding.draft_lengths import best_lookup_length

    linear = lambda slope: (lambda w: 1.0 + slope * (w - 1))  # noqa: E731
    assert best_lookup_length(0.95, linear(0.0), 16) == 16  # free width: the whole continuation
    assert best_lookup_length(0.2, linear(0.3), 16) == 1  # mostly refused, dear width: one token
    assert best_lookup_length(0.0, linear(1.0), 16) == 1  # never less than one: the record must grow
    lengths = [best_lookup_length(a, linear(0.1), 16) for a in (0.3, 0.5, 0.7, 0.9, 0.99)]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    assert best_lookup_length(0.9, linear(0.3), 16) < best_lookup_length(0.9, linear(0.02), 16)
    assert best_lookup_length(0.99, linear(0.0), 3) == 3  # never beyond what lookup found


def test_adaptive_lookup_drafts_grow_with_lookups_record_and_the_masks_keep_their_own(monkeypatch):
    """The masks are always wrong; lookup is right while the output cycles (up to position 40), then
    finds nothing. Lookup's drafts start short (its record starts at the prior) and lengthen as they
    stand; after the cycle, the masks draft by their own record (every mask draft refused: the narrowest
    draft or none), not lookup's (which would have them feed 4-6 masks per forward)."""
    import importlib

    g = importlib.import_module("sbd.decoding.generate")
    monkeypatch.setattr(g, "forward_costs", lambda m, batch=1: (lambda w: 1.0 + 0.1 * (w - 1)))
    ntp = lambda p: _cycle(p) if p < 40 else 8 + (p - 40)  # noqa: E731  (tokens 8..30: never seen before)
    model = TwoHeadLM(ntp, lambda p: 20)
    masks, lookup_widths = [], []

    def observer(rec):
        fed = rec.input_ids[0, -rec.reals[0]:]
        masks.append(int((fed == MASK).sum()))
        if masks[-1] == 0 and rec.reals[0] > 1 and len(masks) > 1:  # a forward verifying a lookup draft
            lookup_widths.append(int(rec.reals[0]))

    out = sbd.generate(model, None, [[5, 6, 7]], method="sbd-verify", block_size=8, draft="adaptive", lookup=True,
                       lookup_max=16, max_new_tokens=58, eos_token_ids=[], observer=observer)
    assert out.token_ids[0] == [ntp(p) for p in range(3, 61)]
    grown = lookup_widths[lookup_widths.index(2):]  # from the first one-token lookup draft on
    assert grown[:6] == sorted(grown[:6]) and max(grown) >= 9 and grown[0] == 2
    after = [m for m, st in zip(masks[1:], range(1, len(masks))) if st > max(out.steps[0][:40])]
    assert after and max(after) <= 2


# -- cache room and width --------------------------------------------------------------------------------
def test_cache_room_covers_the_longest_lookup_draft():
    row = lambda **kw: VerifyRow(DecodeSpec(max_new_tokens=8, **kw), [5, 6], mask_id=MASK)  # noqa: E731
    assert row(block_size=4).needs_extra == 9  # no lookup: as before
    assert row(block_size=4, lookup=True).needs_extra == 17  # 1 + the default 16, no masks
    assert row(block_size=4, lookup=True, lookup_max=40).needs_extra == 41
    assert row(block_size=16, lookup=True).needs_extra == 33  # the default cap fits the default block
    assert row(block_size=4, tree=(2, 2), lookup=True, lookup_max=40).needs_extra == 1 + 3 + 40 + 4
    assert trees.max_nodes((2, 2), 3) == 1 + 3 + 3 + 4 and trees.max_nodes((2, 2), 3, 0) == 1 + 3 + 4


@pytest.mark.parametrize("kw", [dict(), dict(tree=(2, 2)), dict(draft="adaptive")])
def test_no_forward_is_wider_than_the_rows_room(llama, kw, cheap_width):
    prompts = [p * 3 for p in random_prompts(3, llama.config.vocab_size, seed=31)]
    widths = []
    out = sbd.generate(llama, None, prompts, method="sbd-verify", block_size=3, max_new_tokens=40, lookup=True,
                       lookup_max=24, observer=lambda rec: widths.append(max(rec.reals)), **kw)
    row = make_row(DecodeSpec(block_size=3, lookup=True, lookup_max=24, max_new_tokens=40, tree=kw.get("tree")),
                   [5], mask_id=MASK)
    assert max(widths[1:]) <= row.needs_extra and max(max(a) for a in out.accepted) > 2
    assert out.token_ids == [hf_greedy(llama, p, 40) for p in prompts]


# -- exactness on real models ----------------------------------------------------------------------------
def _looping_prompts(model, seed):
    """Prompts that repeat themselves: the tiny random models soon loop, and lookup drafts the loop."""
    return [p + p for p in random_prompts(4, model.config.vocab_size, seed=seed)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("with_adapter", [False, True])
def test_long_lookup_drafts_give_hugging_face_greedy_alone_and_batched(arch, with_adapter, cheap_width):
    model = _model(arch)
    prompts, n, block = _looping_prompts(model, seed=5), 40, 4
    refs = [hf_greedy(model, p, n) for p in prompts]
    if with_adapter:
        attach_random_adapter(model, seed=2)
    try:
        for kw in (dict(), dict(draft="adaptive"), dict(tree=(3, 2, 1)), dict(tree="2,2", draft="adaptive")):
            kw = dict(method="sbd-verify", block_size=block, max_new_tokens=n, lookup=True, **kw)
            batch = sbd.generate(model, None, prompts, **kw)
            assert batch.token_ids == refs, kw
            if kw.get("draft") != "adaptive":  # adaptive: as long as lookup's record says pays (below)
                assert max(a for row in batch.accepted for a in row) > block - 1, kw  # longer than the block
            assert sum(batch.lookup_accepted) > 0
            for i, p in enumerate(prompts):
                alone = sbd.generate(model, None, [p], **kw)
                assert alone.token_ids[0] == refs[i]
                assert (alone.nfe[0], alone.accepted[0], alone.lookup_accepted[0]) == \
                    (batch.nfe[i], batch.accepted[i], batch.lookup_accepted[i]), kw
    finally:
        if with_adapter:
            adapters.detach(model)


def test_static_shapes_with_long_lookup_drafts(llama):
    prompts = _looping_prompts(llama, seed=5)[:2]
    kw = dict(method="sbd-verify", block_size=4, max_new_tokens=30, lookup=True)
    eager = sbd.generate(llama, None, prompts, **kw)
    widths = []
    static = sbd.generate(llama, None, prompts, static_shapes=True,
                          observer=lambda r: widths.append(r.input_ids.shape[1]), **kw)
    assert static.token_ids == eager.token_ids == [hf_greedy(llama, p, 30) for p in prompts]
    assert static.nfe == eager.nfe and max(max(a) for a in static.accepted) > 3
    # powers of two below the widest, block, 2·block, a lookup forward: 1 + 16
    assert set(widths[1:]) <= {1, 2, 4, 8, 16, 17} and 17 in widths


# -- refusals --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "16"])  # (None: the model's default, tests/test_defaults.py)
def test_a_bad_lookup_max_is_refused_in_one_line(llama, bad):
    with pytest.raises(sbd.SBDError, match="lookup_max must be an integer >= 1") as e:
        sbd.generate(llama, None, [[5, 6, 7]], method="sbd-verify", lookup=True, lookup_max=bad, max_new_tokens=4)
    assert "\n" not in str(e.value)
    with pytest.raises(sbd.SBDError, match="lookup_max must be an integer >= 1"):
        DecodeSpec.check(method="sbd-verify", lookup=True, lookup_max=bad, max_new_tokens=4)


def test_a_cap_too_wide_for_an_engine_is_refused_in_one_line(llama):
    engine = Engine(llama, slots=2, capacity=200, max_width=33)
    engine.add(make_row(DecodeSpec(block_size=16, lookup=True, max_new_tokens=20), [5, 6], mask_id=MASK))  # fits
    wide = make_row(DecodeSpec(block_size=16, lookup=True, lookup_max=64, max_new_tokens=20), [5, 6], mask_id=MASK)
    with pytest.raises(sbd.SBDError, match="up to 65 tokens wide; this engine's are at most 33") as e:
        engine.add(wide)
    assert "\n" not in str(e.value) and engine.live == 1


def test_command_line_lookup_max(tmp_path, capsys, monkeypatch):
    import sbd.decoding as g
    from sbd.cli.main import main

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--lookup-max" in capsys.readouterr().out
    torch.manual_seed(0)
    assert main(["init", "--out", str(tmp_path / "m"), "--arch", "llama", "--hidden", "32", "--layers", "1"]) == 0
    args = ["generate", "--model", str(tmp_path / "m"), "--method", "sbd-verify", "--lookup", "--max-new-tokens", "8"]
    seen = []
    real = g.generate
    monkeypatch.setattr(g, "generate", lambda *a, **kw: seen.append(kw.get("lookup_max")) or real(*a, **kw))
    assert main(args + ["--lookup-max", "24", "one two one two one"]) == 0
    assert "of them from lookup" in capsys.readouterr().err and set(seen) == {24}  # statistics: stderr
    with pytest.raises(SystemExit):
        main(args + ["--lookup-max", "0", "x"])
    assert "--lookup-max" in capsys.readouterr().err
