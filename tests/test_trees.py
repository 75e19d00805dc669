"""Tree drafts in sbd-verify (`tree=`, `sbd.decoding.trees`): a verifying forward carries a small tree of
continuations, the next-token head walks it, and only the kept path stays in the cache.

The pieces against naive oracles (the tree mask, the walk, the tree built from paths, the shape filled
from the masks' candidates, the cache compaction); the engine's tree layout against causal forwards of
each node's own path; exactness against Hugging Face greedy decoding on the four architectures, with
and without a drafting adapter, with drafts planted so that the right continuation hides on a branch
off the main chain (wrong walk or wrong compaction: wrong tokens); batch = alone; after every forward
each row's cache is a causal prefill of its committed tokens; the one-line refusals.
"""

import random

import pytest
import torch
from conftest import _model, attach_random_adapter, hf_greedy, random_prompts
from test_verify import EOS, TwoHeadLM
from transformers import DynamicCache

import sbd
from sbd.drafters import adapter as adapters
from sbd.decoding import trees
from sbd.decoding.cache import SlotLayer
from sbd.models.cache_arg import with_cache
from sbd.decoding.engine import Engine
from sbd.decoding.forward import Feed
from sbd.decoding.kinds import make_row
from sbd.decoding.rows import NTPRow
from sbd.decoding.tree_rows import TreeRow
from sbd.decoding.spec import DecodeSpec
from sbd.masks import tree_mask

ARCHS = ["llama", "qwen2", "qwen3", "mistral"]


# -- the pieces, against naive oracles -------------------------------------------------------------------
def _random_tree(rng: random.Random, n: int, alphabet: int = 4):
    """Random parents (parents[i] < i) and tokens, no two siblings alike (as `build_tree` makes them)."""
    parents, tokens = [-1], [rng.randrange(alphabet)]
    for i in range(1, n):
        p = rng.randrange(i)
        taken = {tokens[c] for c in range(1, i) if parents[c] == p}
        free = [t for t in range(alphabet) if t not in taken]
        if not free:
            p = 0 if len({tokens[c] for c in range(1, i) if parents[c] == 0}) < alphabet else i - 1
            free = [t for t in range(alphabet) if t not in {tokens[c] for c in range(1, i) if parents[c] == p}]
        parents.append(p)
        tokens.append(rng.choice(free))
    return tokens, parents


def _ancestors(parents, i):
    """i and its ancestors, by following parents one by one."""
    out = [i]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out


def test_tree_mask_is_each_node_with_its_ancestors():
    rng = random.Random(0)
    for _ in range(60):
        _, parents = _random_tree(rng, rng.randrange(1, 14))
        n = len(parents)
        want = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            for j in _ancestors(parents, i):
                want[i, j] = True
        assert torch.equal(tree_mask(parents), want)
        assert trees.depths(parents) == [len(_ancestors(parents, i)) - 1 for i in range(n)]
    assert torch.equal(tree_mask([-1, 0, 1, 2]), torch.ones(4, 4, dtype=torch.bool).tril())  # a chain is causal
    for bad in ([0], [-1, 1], [-1, 0, 3], [-1, -2]):
        with pytest.raises(ValueError):
            tree_mask(bad)


def test_greedy_walk_keeps_the_longest_path_greedy_decoding_would_produce():
    rng = random.Random(1)
    for _ in range(300):
        tokens, parents = _random_tree(rng, rng.randrange(1, 16))
        kids = trees.children(parents)
        # the next-token head's argmax at each node: often one of its children, else anything
        nxt = [tokens[rng.choice(kids[i])] if kids[i] and rng.random() < 0.75 else rng.randrange(4)
               for i in range(len(tokens))]
        valid = [i for i in range(len(tokens))
                 if all(tokens[a] == nxt[parents[a]] for a in _ancestors(parents, i)[:-1])]
        best = max(valid, key=lambda i: (len(_ancestors(parents, i)), -i))
        assert trees.greedy_walk(tokens, parents, nxt) == _ancestors(parents, best)[::-1]
    assert trees.greedy_walk([7], [-1], [5]) == [0]  # no draft: the head alone, then its next token


def _root_paths(tokens, parents):
    return {tuple(tokens[a] for a in _ancestors(parents, i)[::-1][1:]) for i in range(len(tokens))}


def test_build_tree_merges_paths_and_ends_with_the_main_chain():
    rng = random.Random(2)
    for _ in range(200):
        chain = lambda: [rng.randrange(3) for _ in range(rng.randrange(0, 6))]  # noqa: E731
        main, branches = chain(), [chain() for _ in range(rng.randrange(0, 5))]
        tokens, parents = trees.build_tree(9, main, branches)
        assert tokens[0] == 9 and parents[0] == -1 and all(parents[i] < i for i in range(1, len(parents)))
        prefixes = {tuple(p[:d]) for p in [main, *branches] for d in range(len(p) + 1)}
        assert _root_paths(tokens, parents) == prefixes and len(tokens) == len(prefixes)  # merged, nothing lost
        last = tuple(tokens[a] for a in _ancestors(parents, len(tokens) - 1)[::-1][1:])
        assert last[: len(main)] == tuple(main)  # the block follows the main chain (or a branch continuing it)
        if not any(len(b) > len(main) and b[: len(main)] == main for b in branches):
            assert last == tuple(main)
        for i in range(len(tokens)):  # depth first: every subtree is one contiguous run
            below = [j for j in range(len(tokens)) if i in _ancestors(parents, j)]
            assert below == list(range(i, i + len(below)))


def test_beam_paths_keep_the_most_likely_extensions_per_depth():
    rng = random.Random(3)
    for _ in range(200):
        widths = [rng.randrange(1, 4) for _ in range(rng.randrange(1, 5))]
        depth = rng.randrange(0, len(widths) + 2)
        c = max(widths)
        lps = [sorted((-rng.choice([0.1, 0.5, 1.0, 2.0, 3.0]) for _ in range(c)), reverse=True) for _ in range(depth)]
        toks = [[100 * d + r for r in range(c)] for d in range(depth)]  # token = 100·depth + rank
        paths = trees.beam_paths(widths, toks, lps)
        ranks = [tuple(t % 100 for t in p) for p in paths]
        score = lambda rk: sum(lps[d][r] for d, r in enumerate(rk))  # noqa: E731
        assert len(set(ranks)) == len(ranks) and all(len(p) >= 1 for p in ranks)
        for d in range(1, min(len(widths), depth) + 1):
            at_d = [rk for rk in ranks if len(rk) == d]
            kept_before = [()] if d == 1 else [rk for rk in ranks if len(rk) == d - 1]
            options = [k + (r,) for k in kept_before for r in range(widths[d - 1])]
            assert len(at_d) == min(widths[d - 1], len(options))
            assert (0,) * d in at_d  # the masks' own top-1 chain is always in the tree
            assert all(rk[:-1] in kept_before for rk in at_d)
            worst = min(score(rk) for rk in at_d)
            assert all(score(o) <= worst + 1e-12 for o in options if o not in at_d)
        assert max((len(rk) for rk in ranks), default=0) == min(len(widths), depth)
    lp = [[0.0, float("-inf")], [0.0, -1.0]]  # a -inf candidate (the mask token) never enters
    assert trees.beam_paths([2, 2], [[5, 6], [7, 8]], lp) == [[5], [5, 7], [5, 8]]


def test_compact_moves_one_slots_kept_positions_to_the_front():
    layer = SlotLayer(slots=3, capacity=12, trash=2)
    k = torch.randn(1, 2, 1, 4)
    layer.lazy_initialization(k, k)
    layer._k.normal_()
    layer._v.normal_()
    k0, v0 = layer._k.clone(), layer._v.clone()
    keep = [0, 2, 3, 6]
    layer.compact(1, 4, torch.tensor(keep))
    src = [4 + j for j in keep]
    assert torch.equal(layer._k[1, :, 4:8], k0[1, :, src]) and torch.equal(layer._v[1, :, 4:8], v0[1, :, src])
    assert torch.equal(layer._k[1, :, :4], k0[1, :, :4])  # the prefix before `start` stays
    assert torch.equal(layer._k[[0, 2]], k0[[0, 2]]) and torch.equal(layer._v[[0, 2]], v0[[0, 2]])  # other slots
    assert trees.compaction([0, 5, 2]) == [0, 2, 5]


# -- the engine: a tree feed, checked against causal forwards of each node's own path ------------------
class FixedFeedRow:
    """A row that, after its prefill, feeds one given tree (`parents`, or None for a chain) and `masks`
    mask tokens, records the logits, keeps `keep` and then waits."""

    def __init__(self, prompt, tokens, parents, masks, mask_id, keep):
        self.prompt, self.tokens, self.parents, self.masks, self.mask_id, self.keep = \
            prompt, tokens, parents, masks, mask_id, keep
        self.in_prefill, self.finished, self.logits = True, False, None
        self.needs = len(prompt) + len(tokens) + masks

    def feed(self):
        if self.in_prefill:
            return Feed(self.prompt, len(self.prompt), 0)
        n = len(self.tokens)
        return Feed(self.tokens + [self.mask_id] * self.masks, n, n + self.masks, self.parents)

    def ask(self, logits):
        self.logits = logits.clone()
        return logits[:0, 0]

    def answer(self, values):
        if self.in_prefill:
            self.in_prefill = False
            return 0
        return self.keep


def _last_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=model.device)).logits[0, -1]


def _assert_cache_is_prefill(model, engine, tokens_of):
    """Every live row's committed keys and values equal a causal prefill of its committed tokens."""
    for i, row in enumerate(engine.rows):
        n = engine.lengths[i]
        if not n:
            continue
        ids = tokens_of(row)[:n]
        assert len(ids) == n
        ref = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=torch.tensor([ids], device=model.device), **with_cache(model, ref), use_cache=True)
        for layer, want in zip(engine.cache.layers, ref.layers):
            assert (layer._k[i, :, :n] - want.keys[0]).abs().max() <= 1e-4
            assert (layer._v[i, :, :n] - want.values[0]).abs().max() <= 1e-4


@pytest.mark.parametrize("prefill", ["separate", "mixed"])
def test_a_tree_feed_sees_each_nodes_own_path_and_keeps_one_path(prefill):
    """Node logits = a causal forward of prompt + that node's path; mask logits = the same masks fed
    after the last node's path as a plain chain; after the keep, the cache is that path's prefill. In a
    batch beside a chain row of another length (rows laid out differently in one forward)."""
    model = _model("qwen3", seed=5)
    attach_random_adapter(model, seed=4)  # the masks go through the gate, as in sbd-verify
    try:
        mask = model.config.sbd_mask_token_id
        prompt = random_prompts(1, model.config.vocab_size, lengths=(6,), seed=8)[0]
        tokens, parents = trees.build_tree(11, [20, 21, 22], [[30, 31], [20, 40, 41], [20, 21, 50]])
        assert tokens == [11, 30, 31, 20, 40, 41, 21, 50, 22]  # depth first, the main chain last
        keep = [0, 3, 4, 5]  # head → 20 → 40 → 41, not a prefix of the feed
        assert [tokens[i] for i in keep] == [11, 20, 40, 41]
        tree_row = FixedFeedRow(prompt, tokens, parents, 3, mask, keep)
        chain = [tokens[a] for a in _ancestors(parents, len(tokens) - 1)[::-1]]  # the last node's path
        chain_row = FixedFeedRow(prompt, chain, None, 3, mask, list(range(len(chain))))
        other = NTPRow(DecodeSpec(method="ntp", max_new_tokens=4), random_prompts(1, model.config.vocab_size, lengths=(11,), seed=9)[0])
        engine = Engine(model, slots=3, capacity=64, max_width=16, prefill=prefill)
        with torch.inference_mode():
            for r in (tree_row, other, chain_row):
                engine.add(r)
            while tree_row.logits is None:
                engine.step()
            for i in range(len(tokens)):
                ids = prompt + [tokens[a] for a in _ancestors(parents, i)[::-1]]
                torch.testing.assert_close(tree_row.logits[i], _last_logits(model, ids), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(tree_row.logits[len(tokens):], chain_row.logits[len(chain):], atol=1e-4,
                                       rtol=1e-4)
            assert engine.lengths[engine.rows.index(tree_row)] == len(prompt) + len(keep)
            kept = {id(tree_row): prompt + [tokens[i] for i in keep], id(chain_row): prompt + chain,
                    id(other): other.prompt + other.out}
            _assert_cache_is_prefill(model, engine, lambda r: kept[id(r)])
    finally:
        adapters.detach(model)


def test_adaptive_drafting_prices_the_branches():
    from sbd.decoding.draft_lengths import best_draft_length

    cost = lambda w: 1 + 0.05 * (w - 1)  # noqa: E731
    assert best_draft_length(0.9, cost, 15, tree=(1,)) == best_draft_length(0.9, cost, 15)  # no branch
    assert best_draft_length(0.9, cost, 15, tree=(8,) * 15) < best_draft_length(0.9, cost, 15)  # wide: shorter


# -- a scripted model: which forwards a tree saves -------------------------------------------------------
def _script(p):
    return 3 + (p * 7) % 20


def _second_best(p):
    """The masks rank a wrong token first and the right one second."""
    return {4 if _script(p) != 4 else 5: 10.0, _script(p): 9.0}


def test_a_right_second_candidate_is_kept_from_a_branch():
    from sbd.decoding.draft_policy import DraftOptions

    model = TwoHeadLM(_script, _second_best)
    kw = dict(method="sbd-verify", block_size=4, max_new_tokens=20, eos_token_ids=[],
              draft_options=DraftOptions(reuse_leftover=False))  # the masks' top-1 is always wrong here
    chain = sbd.generate(model, None, [[5, 6, 7]], **kw)
    tree = sbd.generate(model, None, [[5, 6, 7]], tree=(2,), **kw)
    want = [_script(p) for p in range(3, 23)]
    assert chain.token_ids[0] == tree.token_ids[0] == want
    assert chain.nfe == [20]  # every chain draft refused
    # a forward with masks' candidates keeps the second one (a branch off the main chain) + the next
    # token; the masks followed the main chain, so the forward after it drafts afresh: 1, 2, 1, 2, …
    assert tree.accepted[0] == [0, 1] * 6 + [0, 0] and tree.nfe == [14]  # the last two: no room for a draft
    assert tree.steps[0][:7] == [1, 2, 2, 3, 4, 4, 5]


def test_right_drafts_on_the_main_chain_fill_a_block_as_a_chain_does():
    model = TwoHeadLM(_script, lambda p: {_script(p): 10.0, 4 if _script(p) != 4 else 5: 9.0})
    kw = dict(method="sbd-verify", block_size=4, max_new_tokens=40, eos_token_ids=[])
    chain = sbd.generate(model, None, [[5, 6, 7]], **kw)
    tree = sbd.generate(model, None, [[5, 6, 7]], tree=(3, 2), **kw)
    assert tree.token_ids == chain.token_ids and tree.nfe == chain.nfe == [11]
    assert tree.accepted == chain.accepted


def test_eos_on_a_kept_branch_ends_the_row_there():
    ntp = lambda p: EOS if p == 6 else _script(p)  # noqa: E731
    model = TwoHeadLM(ntp, lambda p: {4 if ntp(p) != 4 else 5: 10.0, ntp(p): 9.0})
    out = sbd.generate(model, None, [[5, 6, 7]], method="sbd-verify", block_size=4, max_new_tokens=40, tree=(2, 2))
    assert out.token_ids[0] == [ntp(3), ntp(4), ntp(5), EOS]


def test_lookups_chain_is_the_main_branch_and_is_counted():
    from test_lookup import _cycle

    model = TwoHeadLM(_cycle, lambda p: {20: 10.0, 21: 9.0})  # the masks' candidates never come
    kw = dict(method="sbd-verify", block_size=8, max_new_tokens=40, eos_token_ids=[], lookup=True)
    chain = sbd.generate(model, None, [[5, 6, 7]], **kw)
    tree = sbd.generate(model, None, [[5, 6, 7]], tree=(2, 2), **kw)
    assert tree.token_ids == chain.token_ids and tree.token_ids[0] == [_cycle(p) for p in range(3, 43)]
    assert tree.nfe == chain.nfe and tree.accepted == chain.accepted
    assert tree.lookup_accepted[0] == sum(tree.accepted[0]) > 25


# -- real models: planted trees, Hugging Face greedy, batch = alone, the cache after every forward ------
class PlantedTreeRow(TreeRow):
    """A tree row whose drafts are planted from the reference greedy output `ref`: mostly the right
    continuation hides on a branch that leaves the main chain at a random depth and goes wrong later,
    with decoys around it; sometimes the main chain is right. Seeded per row: batch = alone holds."""

    def __init__(self, prompt, ref, seed, vocab, *, mask_id, eos=(), **spec):
        super().__init__(DecodeSpec(block_size=5, tree=(2, 2), **spec), prompt, mask_id=mask_id, eos=eos)
        self.ref, self.rng, self.vocab = ref, random.Random(seed), vocab
        self.keeps = []

    def _other(self, t):
        return 3 + (t - 3 + 1 + self.rng.randrange(self.vocab - 5)) % (self.vocab - 3)

    def _decoy(self, truth, d):
        """Right for d tokens, then wrong."""
        wrong = self._other(truth[d]) if d < len(truth) else self.rng.randrange(3, self.vocab)
        return truth[:d] + [wrong] + [self.rng.randrange(3, self.vocab) for _ in range(2)]

    def feed(self):
        if not self.in_prefill:
            k = self.block_size - 1
            truth = self.ref[len(self.out) : len(self.out) + k]
            if not truth or self.rng.random() < 0.2:
                main, branches = truth, [self._decoy(truth, self.rng.randrange(len(truth) + 1))]
            else:
                j = self.rng.randrange(len(truth))  # the main chain goes wrong at depth j + 1
                main = (truth[:j] + [self._other(truth[j])] + [self.rng.randrange(3, self.vocab)] * k)[:k]
                good = self._decoy(truth, self.rng.randrange(j + 1, len(truth) + 1))  # right past depth j
                branches = [good, self._decoy(truth, self.rng.randrange(j + 1)),
                             self._decoy(truth, self.rng.randrange(len(truth) + 1))]
                self.rng.shuffle(branches)
            self.draft, self.branches = main, [b[:k] for b in branches]
        return super().feed()

    def answer(self, values):
        keep = super().answer(values)
        if isinstance(keep, list):
            self.keeps.append(keep)
        return keep


def _decode(model, rows, prefill="separate", slots=None, check=True):
    """Rows through one engine (joining as slots free up); after every step, optionally, every live
    row's cache is checked against a causal prefill of its committed tokens."""
    engine = Engine(model, slots or len(rows), max(r.needs for r in rows),
                    max_width=max(r.needs_extra for r in rows), prefill=prefill)
    waiting = list(rows)
    with torch.inference_mode():
        while waiting or engine.live:
            while waiting and engine.live < engine.slots:  # a row joins as soon as a slot is free
                engine.add(waiting.pop(0))
            engine.step()
            if check:
                _assert_cache_is_prefill(model, engine, lambda r: r.prompt + r.out)
    return rows


def _planted(model, prompt, ref, seed, **kw):
    eos = [model.config.eos_token_id]
    return PlantedTreeRow(prompt, ref, seed, model.config.vocab_size, mask_id=model.config.sbd_mask_token_id,
                          max_new_tokens=len(ref) + 2, eos=eos, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_planted_branches_give_hugging_face_greedy_and_a_causal_cache(arch):
    model = _model(arch, seed=6)
    prompts = random_prompts(3, model.config.vocab_size, lengths=(5, 12, 2), seed=21)
    refs = [hf_greedy(model, p, 24) for p in prompts]
    rows = _decode(model, [_planted(model, p, ref, seed=i) for i, (p, ref) in enumerate(zip(prompts, refs))])
    for row, ref in zip(rows, refs):
        assert row.out[: len(ref)] == ref
        assert sum(row.accepted) > len(ref) // 3  # the planted paths were kept
        assert any(k != list(range(len(k))) for k in row.keeps)  # … from branches: the cache was compacted


@pytest.mark.parametrize("prefill", ["separate", "mixed"])
def test_batch_equals_alone_with_trees_beside_other_rows(prefill):
    """Tree rows (planted and drafted by the masks), chain rows and NTP rows of different prompt lengths
    in one engine with fewer slots than rows (rows join as others leave): every row equals itself alone
    (tokens, forwards, steps, accepted counts), and every live row's cache is a causal prefill after
    every step."""
    model = _model("llama", seed=7)
    attach_random_adapter(model, seed=3)
    try:
        vocab, mask, eos = model.config.vocab_size, model.config.sbd_mask_token_id, [model.config.eos_token_id]
        prompts = random_prompts(6, vocab, lengths=(3, 14, 7, 1, 9, 4), seed=22)
        refs = [hf_greedy(model, p, 20) for p in prompts]

        def rows():
            return [_planted(model, prompts[0], refs[0], seed=1),
                    make_row(DecodeSpec(block_size=4, tree=(3, 2, 1), max_new_tokens=20), prompts[1], mask_id=mask,
                             eos=eos),
                    make_row(DecodeSpec(method="ntp", max_new_tokens=13), prompts[2], mask_id=mask, eos=eos),
                    _planted(model, prompts[3], refs[3], seed=2),
                    make_row(DecodeSpec(block_size=4, max_new_tokens=17), prompts[4], mask_id=mask, eos=eos),
                    make_row(DecodeSpec(block_size=4, tree=(2,), lookup=True, max_new_tokens=20), prompts[5] * 3,
                             mask_id=mask, eos=eos)]
        batch = _decode(model, rows(), prefill=prefill, slots=4)
        for i, row in enumerate(batch):
            alone = _decode(model, [rows()[i]], check=False)[0]
            assert (row.out, row.nfe, row.steps, row.accepted) == (alone.out, alone.nfe, alone.steps, alone.accepted)
        assert batch[0].out[: len(refs[0])] == refs[0] and batch[3].out[: len(refs[3])] == refs[3]
        assert batch[1].out == refs[1]
    finally:
        adapters.detach(model)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("with_adapter", [False, True])
def test_tree_drafts_give_hugging_face_greedy(arch, with_adapter, cheap_width):
    model = _model(arch)
    base = random_prompts(4, model.config.vocab_size, seed=23)
    prompts = base[:2] + [p + p for p in base[2:]]  # two of them repeat themselves: lookup finds chains
    n = 20
    refs = [hf_greedy(model, p, n) for p in prompts]
    if with_adapter:
        attach_random_adapter(model, seed=5)
    try:
        for kw in (dict(tree=(3, 2, 1)), dict(tree="2,2", draft="adaptive", lookup=True)):
            out = sbd.generate(model, None, prompts, method="sbd-verify", block_size=4, max_new_tokens=n, **kw)
            assert out.token_ids == refs
            assert all(len(a) == k for a, k in zip(out.accepted, out.nfe))
            assert all(sum(a) + k >= len(t) for a, k, t in zip(out.accepted, out.nfe, out.token_ids))
    finally:
        if with_adapter:
            adapters.detach(model)


def test_tree_drafts_keep_ntps_output_under_logit_processors(llama):
    prompts = random_prompts(2, llama.config.vocab_size, seed=24)
    kw = dict(max_new_tokens=16, eos_token_ids=[], logit_bias={7: 3.0, 9: -100}, presence_penalty=0.8,
              frequency_penalty=0.5, logprobs=2)
    ntp = sbd.generate(llama, None, prompts, method="ntp", **kw)
    tree = sbd.generate(llama, None, prompts, method="sbd-verify", block_size=4, tree=(3, 2), **kw)
    assert tree.token_ids == ntp.token_ids
    for a, b in zip(tree.logprobs, ntp.logprobs):
        assert [t for t, _, _ in a] == [t for t, _, _ in b]
        assert [lp for _, lp, _ in a] == pytest.approx([lp for _, lp, _ in b], abs=1e-4)


def test_penalties_in_a_tree_count_each_nodes_own_path():
    """`processed` with a tree: node i counts the draft tokens of its ancestors and itself (a loop)."""
    from sbd.decoding.processing import Processing, processed

    rng = random.Random(4)
    p = Processing({3: 1.5}, presence_penalty=0.7, frequency_penalty=0.4)
    for _ in range(30):
        tokens, parents = _random_tree(rng, rng.randrange(1, 10), alphabet=5)
        logits, counts = torch.randn(len(tokens), 6), torch.tensor([0.0, 2, 0, 1, 0, 0])
        got = processed(logits, p, torch.tensor([0.0, 0, 0, 1.5, 0, 0]), counts, torch.tensor(tokens[1:]),
                        tree_mask(parents))
        for i in range(len(tokens)):
            c = counts.clone()
            for a in _ancestors(parents, i)[:-1]:  # the head (root) is already counted in `counts`
                c[tokens[a]] += 1
            want = logits[i] + torch.tensor([0.0, 0, 0, 1.5, 0, 0]) - 0.7 * (c > 0).float() - 0.4 * c
            torch.testing.assert_close(got[i], want)


def test_planted_branches_under_penalties_give_ntps_output():
    """Penalties strong enough to change tokens on a soft model: a tree row whose right continuation
    hides on branches equals NTP under the same processors (each node counts its own path only)."""
    from sbd.decoding.processing import Processing
    from sbd.models import tiny

    cfg = tiny.tiny_config("llama", vocab_size=48, hidden=32, layers=1, heads=2, kv_heads=1, context=128)
    model = tiny.random_model(cfg, seed=2, logit_scale=4.0)
    model.config.sbd_mask_token_id = 47
    kw = dict(logit_bias={5: 2.0}, presence_penalty=1.5, frequency_penalty=1.0)
    prompts = random_prompts(2, 40, lengths=(4, 9), seed=25)
    for i, prompt in enumerate(prompts):
        ref = sbd.generate(model, None, [prompt], method="ntp", max_new_tokens=24, eos_token_ids=[], **kw)
        plain = sbd.generate(model, None, [prompt], method="ntp", max_new_tokens=24, eos_token_ids=[])
        assert ref.token_ids != plain.token_ids  # the processors matter here
        row = PlantedTreeRow(prompt, ref.token_ids[0], i, 40, mask_id=47, max_new_tokens=24,
                             processing=Processing(**kw))
        _decode(model, [row], check=False)
        assert row.out == ref.token_ids[0]
        assert any(k != list(range(len(k))) for k in row.keeps)


# -- refusals ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    (dict(method="sbd-verify", temperature=0.7, seed=1), "greedy decoding"),
    (dict(method="sbd-verify", draft="eb"), "draft='block'"),
    (dict(method="sbd"), "method='sbd-verify'"),
    (dict(method="ntp"), "method='sbd-verify'"),
    (dict(method="sbd-verify", static_shapes=True), "no fixed widths"),
    (dict(method="sbd-verify", compile=True), "no fixed widths"),
    (dict(method="sbd-verify", tree=(0, 2)), "widths per depth"),
    (dict(method="sbd-verify", tree="3,x"), "widths per depth"),
    (dict(method="sbd-verify", tree="chain,2"), "widths per depth"),
    (dict(method="sbd-verify", tree=[2, True]), "widths per depth"),
    (dict(method="sbd-verify", tree=(99,)), "widths per depth"),
])
def test_tree_misuse_is_refused_in_one_line(llama, kw, match):
    kw = {"tree": (2, 1), **kw}
    with pytest.raises(sbd.SBDError, match=match) as e:
        sbd.generate(llama, None, [[5, 6, 7]], max_new_tokens=4, **kw)
    assert "\n" not in str(e.value)


def test_a_sampled_or_eb_tree_is_refused_in_one_line():
    with pytest.raises(sbd.SBDError, match="with greedy decoding") as e:
        DecodeSpec.check(tree=(2,), max_new_tokens=8, temperature=1.0)
    assert e.value.field == "tree"
    with pytest.raises(sbd.SBDError, match="draft='block' or draft='adaptive'"):
        DecodeSpec.check(tree=(2,), max_new_tokens=8, draft="eb", gamma=0.3)
    with pytest.raises(sbd.SBDError, match="method='sbd-verify'"):
        DecodeSpec.check(method="sbd", tree=(2,), max_new_tokens=8)


def test_command_line_tree(tmp_path, capsys):
    from sbd.cli.main import main

    torch.manual_seed(0)
    assert main(["init", "--out", str(tmp_path / "m"), "--arch", "llama", "--hidden", "32", "--layers", "1"]) == 0
    args = ["generate", "--model", str(tmp_path / "m"), "--method", "sbd-verify", "--max-new-tokens", "6"]
    assert main(args + ["--tree", "3,2", "one two one two"]) == 0
    assert "SBD-VERIFY" in capsys.readouterr().err  # the statistics table: on stderr
    assert main(args + ["--tree", "3,0", "x"]) == 2
    assert "tree is a list of" in capsys.readouterr().err
    assert main(args + ["--tree", "2", "--temperature", "0.5", "x"]) == 2
    assert "--tree applies to --method sbd-verify with greedy" in capsys.readouterr().err  # as the command writes it
