"""OpenAI's logit processors (logit_bias, presence/frequency penalties, top_p) and logprobs.

They act on the next-token head, so greedy sbd-verify under them equals greedy NTP under them, token for
token: both are checked against a naive oracle (the full sequence recomputed every step by the plain
model, the processors applied by hand) and against Hugging Face `generate` with the same rule as a
logits processor, on the four tiny architectures with a random drafting adapter and lookup drafts.
Sampled sbd-verify keeps the processed distribution exactly; logprobs are the raw head's log-softmax.
"""

from collections import Counter

import pytest
import torch
from conftest import _model, attach_random_adapter, blocks, random_prompts
from test_host_sync import _reads_and_forwards, count_reads  # noqa: F401  (count_reads is a fixture)
from test_verify import MASK, V, TwoHeadLM, _exact_marginals  # noqa: F401
from transformers import LogitsProcessor, LogitsProcessorList, TopPLogitsWarper

import sbd
from sbd.drafters import adapter as adapters
from sbd.decoding.engine import Engine
from sbd.decoding.processing import Processing, nucleus, target_probs
from sbd.decoding.kinds import make_row
from sbd.decoding.spec import DecodeSpec
from sbd.models import tiny

N = 16


def by_hand(logits, out, bias=None, presence=0.0, frequency=0.0):
    """OpenAI's rule written out: bias added, then each generated token's penalty subtracted."""
    logits = logits.float().clone()
    for t, b in (bias or {}).items():
        logits[t] += b
    for t, c in Counter(out).items():
        logits[t] -= presence * (c > 0) + frequency * c
    return logits


def next_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids], device=model.device), use_cache=False).logits[0, -1].float()


def oracle(model, prompt, n, eos=(), **proc):
    """Greedy decoding the slow way: the whole sequence recomputed every step, processors by hand."""
    out = []
    for _ in range(n):
        t = int(by_hand(next_logits(model, prompt + out), out, **proc).argmax())
        out.append(t)
        if t in eos:
            break
    return out


def _cases(model, prompts):
    """A bias that forces a likely-but-not-top token, a -100 bias that bans each first greedy token,
    the largest penalties, negative penalties (repeats rewarded), and all at once."""
    first = next_logits(model, prompts[0]).topk(2).indices.tolist()
    greedy = sorted({int(next_logits(model, p).argmax()) for p in prompts})
    return {
        "force": dict(bias={first[1]: 100.0}),
        "ban": dict(bias={t: -100.0 for t in greedy}),
        "penalties": dict(presence=2.0, frequency=2.0),
        "rewards": dict(presence=-1.0, frequency=-2.0),
        "all": dict(bias={first[1]: 30.0, greedy[0]: -20.0}, presence=0.5, frequency=1.5),
    }


def _kw(proc):
    return dict(logit_bias=proc.get("bias"), presence_penalty=proc.get("presence", 0.0),
                frequency_penalty=proc.get("frequency", 0.0))


@pytest.mark.parametrize("case", ["force", "ban", "penalties", "rewards", "all"])
def test_greedy_ntp_and_sbd_verify_follow_the_naive_oracle(model, case, cheap_width):
    prompts = [p + p for p in random_prompts(2, model.config.vocab_size, seed=11)]  # lookup finds matches
    proc = _cases(model, prompts)[case]
    eos = [model.config.eos_token_id]
    want = [oracle(model, p, N, eos, **proc) for p in prompts]
    plain = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=N)
    assert plain.token_ids != want  # the processors changed something
    assert sbd.generate(model, None, prompts, method="ntp", max_new_tokens=N, **_kw(proc)).token_ids == want
    attach_random_adapter(model, seed=2)
    try:
        kept = 0
        for kw in (dict(), dict(lookup=True), dict(draft="adaptive", lookup=True)):
            out = sbd.generate(model, None, prompts, method="sbd-verify", block_size=4, max_new_tokens=N,
                               **kw, **_kw(proc))
            assert out.token_ids == want, kw
            kept += sum(map(sum, out.accepted))
        assert kept > 0 or case not in ("force", "rewards")  # forwards verified several positions at once
    finally:
        adapters.detach(model)


class ScriptedLM(TwoHeadLM):
    """TwoHeadLM (tokens 3, 4, 3, 4, … at logit 10) over a small descending ramp that breaks ties, so that
    a penalised token gives way to a definite other one."""

    BASE = -0.01 * torch.arange(V, dtype=torch.float32)
    BASE[[0, 1, 2, MASK]] = -50.0

    def __init__(self):
        super().__init__(self.script, self.script)

    @staticmethod
    def script(p):
        return 3 + p % 2

    def forward(self, *a, **kw):
        out = super().forward(*a, **kw)
        out.logits = out.logits + self.BASE
        return out

    def oracle(self, prompt, n, **proc):
        out = []
        for _ in range(n):
            logits = self.BASE.clone()
            logits[self.script(len(prompt) + len(out))] += 10.0
            out.append(int(by_hand(logits, out, **proc).argmax()))
        return out


def test_penalties_count_the_draft_tokens_before_each_verified_position():
    """Perfect drafts of the unpenalised script: in one forward, the count of token 3 grows with every
    draft token, so the verifying head must refuse the draft where the penalty bites, as NTP would."""
    model = ScriptedLM()
    proc = dict(frequency=2.0, presence=0.5, bias={5: 0.5})
    want = model.oracle([5, 6, 7], 40, **proc)
    assert want[:4] == [4, 3, 4, 3] and want != [model.script(p) for p in range(3, 43)]
    kw = dict(max_new_tokens=40, eos_token_ids=[], **_kw(proc))
    assert sbd.generate(model, None, [[5, 6, 7]], method="ntp", **kw).token_ids[0] == want
    out = sbd.generate(model, None, [[5, 6, 7]], method="sbd-verify", block_size=8, **kw)
    assert out.token_ids[0] == want
    assert max(out.accepted[0]) >= 3 and out.nfe[0] < 40


class OpenAIPenalties(LogitsProcessor):
    """The penalties as a Hugging Face logits processor: counts over the tokens after the prompt."""

    def __init__(self, start, presence, frequency):
        self.start, self.presence, self.frequency = start, presence, frequency

    def __call__(self, input_ids, scores):
        gen = input_ids[:, self.start:]
        counts = torch.zeros_like(scores).scatter_add_(1, gen, torch.ones_like(gen, dtype=scores.dtype))
        return scores - self.presence * (counts > 0).to(scores.dtype) - self.frequency * counts


def _hf(model, prompt, proc):
    with torch.no_grad():
        ids = torch.tensor([prompt], device=model.device)
        extra = dict(sequence_bias={(t,): b for t, b in proc["bias"].items()}) if proc.get("bias") else {}
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=N,
                             logits_processor=LogitsProcessorList(
                                 [OpenAIPenalties(len(prompt), proc.get("presence", 0.0), proc.get("frequency", 0.0))]),
                             **extra)[0, len(prompt):].tolist()
    eos = model.generation_config.eos_token_id
    return out[: out.index(eos) + 1] if eos in out else out


def test_hugging_face_generate_with_the_same_rule_agrees(model):
    prompts = random_prompts(2, model.config.vocab_size, seed=4)
    cases = _cases(model, prompts)
    for case in ("ban", "all"):
        proc = cases[case]
        want = [_hf(model, p, proc) for p in prompts]
        for method in ("ntp", "sbd-verify"):
            out = sbd.generate(model, None, prompts, method=method, **blocks(method, 4), max_new_tokens=N, **_kw(proc))
            assert out.token_ids == want, (case, method)


def _check_logprobs(model, prompt, tokens, logprobs, k):
    assert len(logprobs) == len(tokens)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens], device=model.device)).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits, -1)
    for i, (t, value, alts) in enumerate(logprobs):
        assert t == tokens[i] and abs(value - float(lp[i, t])) <= 1e-4
        top = lp[i].topk(k)
        assert [a for a, _ in alts] == top.indices.tolist()
        assert max((abs(b - float(v)) for (_, b), v in zip(alts, top.values)), default=0.0) <= 1e-4


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_logprobs_are_the_raw_next_token_distribution(model, temperature):
    prompts = [p + p for p in random_prompts(3, model.config.vocab_size, seed=8)]
    kw = dict(max_new_tokens=N, temperature=temperature, seed=3, logprobs=3, frequency_penalty=1.0,
              logit_bias={int(next_logits(model, prompts[0]).argmax()): -5.0})
    free = sbd.generate(model, None, prompts[:1], method="ntp", eos_token_ids=[], **kw)
    kw["eos_token_ids"] = [free.token_ids[0][7]]  # rows end early; logprobs are cut with the tokens
    assert sbd.generate(model, None, prompts, method="ntp", max_new_tokens=N).logprobs is None
    outs = [sbd.generate(model, None, prompts, method="ntp", **kw)]
    attach_random_adapter(model, seed=1)
    try:
        outs.append(sbd.generate(model, None, prompts, method="sbd-verify", block_size=4,
                                 **({"lookup": True} if temperature == 0 else {}), **kw))  # lookup: greedy only
    finally:
        adapters.detach(model)
    assert len({len(t) for t in outs[0].token_ids}) > 1 or temperature > 0
    for out in outs:
        for p, tokens, lps in zip(prompts, out.token_ids, out.logprobs):
            _check_logprobs(model, p, tokens, lps, 3)
    if temperature == 0:
        assert outs[0].token_ids == outs[1].token_ids
    zero = sbd.generate(model, None, prompts[:1], method="ntp", max_new_tokens=4, logprobs=0)
    assert [alts for _, _, alts in zero.logprobs[0]] == [[]] * len(zero.token_ids[0])


def _run(model, rows):
    engine = Engine(model, slots=len(rows), capacity=96, max_width=9)
    for r in rows:
        engine.add(r)
    while engine.live:
        engine.step()
    return rows


def test_rows_with_different_processing_batched_equal_alone(model):
    prompts = random_prompts(5, model.config.vocab_size, seed=6)
    specs = [
        ("ntp", 0.0, Processing(logit_bias={7: 60.0}, logprobs=2)),
        ("sbd-verify", 0.0, Processing(presence_penalty=2.0, frequency_penalty=1.0, logprobs=1)),
        ("ntp", 2.0, Processing(top_p=0.7, frequency_penalty=0.5, logprobs=4)),
        ("sbd-verify", 2.0, Processing(top_p=0.8, logit_bias={9: -100, 10: 20}, presence_penalty=1.0)),
        ("sbd-verify", 0.0, Processing()),
    ]

    def rows():
        return [make_row(DecodeSpec(method=m, block_size=4, max_new_tokens=N, temperature=t, processing=proc), p,
                         mask_id=MASK_ID(model), eos=[model.config.eos_token_id], seed=100 + i)
                for i, ((m, t, proc), p) in enumerate(zip(specs, prompts))]

    batch = _run(model, rows())
    alone = [_run(model, [r])[0] for r in rows()]
    for b, a in zip(batch, alone):
        assert (b.out, b.nfe) == (a.out, a.nfe)
        assert (b.logprobs is None) == (a.logprobs is None)
        for x, y in zip(b.logprobs or [], a.logprobs or []):
            assert x[0] == y[0] and abs(x[1] - y[1]) <= 1e-4 and [t for t, _ in x[2]] == [t for t, _ in y[2]]
    assert batch[0].out.count(7) > 0 and batch[4].logprobs is None


def MASK_ID(model):
    return model.config.sbd_mask_token_id


def test_a_tiny_top_p_is_greedy(llama):
    prompts = random_prompts(3, llama.config.vocab_size, seed=2)
    kw = dict(max_new_tokens=N, presence_penalty=1.0, logit_bias={5: 10.0})
    greedy = sbd.generate(llama, None, prompts, method="ntp", **kw)
    for method in ("ntp", "sbd-verify"):
        tiny_p = sbd.generate(llama, None, prompts, method=method, temperature=5.0, seed=0, top_p=1e-9, **kw)
        assert tiny_p.token_ids == greedy.token_ids
    wide = sbd.generate(llama, None, prompts, method="ntp", temperature=5.0, seed=0, **kw)
    assert wide.token_ids != greedy.token_ids  # the temperature alone would have sampled other tokens


def test_top_p_samples_stay_inside_the_nucleus(llama):
    """Seeded samples at temperature 4 with top_p 0.6: every token lies in the nucleus that Hugging Face's
    own top-p warper keeps for the processed logits at that step."""
    prompts = random_prompts(3, llama.config.vocab_size, seed=5)
    proc = dict(bias={11: 40.0}, presence=1.0, frequency=0.5)
    warp = TopPLogitsWarper(0.6)
    sizes = []
    for method in ("ntp", "sbd-verify"):
        for seed in range(3):
            out = sbd.generate(llama, None, prompts, method=method, temperature=4.0, top_p=0.6, seed=seed,
                               max_new_tokens=12, eos_token_ids=[], **_kw(proc))
            for p, tokens in zip(prompts, out.token_ids):
                for i, t in enumerate(tokens):
                    scores = by_hand(next_logits(llama, p + tokens[:i]), tokens[:i], **proc) / 4.0
                    kept = torch.isfinite(warp(None, scores[None]))[0]
                    assert kept[t], (method, seed, i)
                    sizes.append(int(kept.sum()))
    assert max(sizes) > 2  # the nucleus held several tokens, so the draw mattered


def test_nucleus_keeps_what_hugging_face_keeps():
    g = torch.Generator().manual_seed(0)
    for top_p in (0.1, 0.5, 0.9, 0.99):
        scores = torch.randn(16, 50, generator=g) * 3
        ours = nucleus(torch.softmax(scores, -1), top_p) > 0
        hf = torch.isfinite(TopPLogitsWarper(top_p)(None, scores.clone()))
        assert torch.equal(ours, hf)
    p = target_probs(torch.tensor([[2.0, 1.0, 0.0, -9.0]]), 1.0, 0.8)
    assert p[0, 3] == 0 and abs(float(p.sum()) - 1) < 1e-6


def test_sampled_sbd_verify_keeps_the_processed_distribution():
    """Tokens 1-3 after a fixed prompt, sampled 1,000 times by sbd-verify under bias, penalties and
    top_p, against the exact marginals of NTP sampling under the same processors."""
    cfg = tiny.tiny_config("llama", vocab_size=8, hidden=16, layers=1, heads=2, kv_heads=1, context=64)
    model = tiny.random_model(cfg, seed=4, logit_scale=1.0)
    model.config.sbd_mask_token_id = 7
    proc = dict(bias={4: 1.5, 6: -1.0}, presence=1.0, frequency=0.7)
    top_p, prompt, n = 0.85, [1, 2, 3], 1000

    seqs, exact = {(): 1.0}, []
    for _ in range(3):
        nxt, m = {}, torch.zeros(8)
        for seq, w in seqs.items():
            p = target_probs(by_hand(next_logits(model, prompt + list(seq)), list(seq), **proc), 1.0, top_p)
            m += w * p
            nxt.update({seq + (t,): w * float(p[t]) for t in range(8) if p[t] > 0})
        exact.append(m)
        seqs = nxt
    counts, accepted = torch.zeros(3, 8), 0
    for s in range(0, n, 100):  # a batch of 100 rows, row i sampling with seed s + i (batch = alone)
        out = sbd.generate(model, None, [prompt] * 100, method="sbd-verify", block_size=4, max_new_tokens=3,
                           temperature=1.0, top_p=top_p, seed=s, eos_token_ids=[], **_kw(proc))
        for tokens, kept in zip(out.token_ids, out.accepted):
            for j, t in enumerate(tokens):
                counts[j, t] += 1
            accepted += sum(kept)
    assert accepted > n / 5
    tv = 0.5 * (counts / n - torch.stack(exact)).abs().sum(-1)
    assert tv.max() < 0.07, tv  # sampling noise at n = 1,000 over 8 outcomes: TV ~ 0.025


@pytest.mark.parametrize("method", ["ntp", "sbd-verify"])
def test_one_host_read_per_forward_with_processors(llama, count_reads, method):  # noqa: F811
    prompts = random_prompts(2, llama.config.vocab_size, lengths=(5, 9))
    kw = dict(method=method, **blocks(method, 4), logprobs=2, presence_penalty=1.0, frequency_penalty=0.5,
              logit_bias={5: 3.0})
    short_reads, short_nfe = _reads_and_forwards(llama, count_reads, prompts, max_new_tokens=12, **kw)
    long_reads, long_nfe = _reads_and_forwards(llama, count_reads, prompts, max_new_tokens=36, **kw)
    assert long_nfe > short_nfe and long_reads - short_reads == long_nfe - short_nfe


@pytest.mark.parametrize("kw,match", [
    (dict(method="sbd", logit_bias={5: 1.0}), "^logit_bias acts on the next-token head, read by method='ntp' and "
                                              "method='sbd-verify'"),
    (dict(method="sbd", logprobs=1), "^logprobs=1 acts on the next-token head, read by method='ntp' and"),
    (dict(method="ntp", logit_bias={10_000: 1.0}), "logit_bias token id 10000 lies outside"),
    (dict(method="ntp", logit_bias={-1: 1.0}), "logit_bias token id -1 lies outside"),
    (dict(method="ntp", logit_bias={5: 101}), r"logit_bias\[5\] must be a number from -100 to 100"),
    (dict(method="ntp", logit_bias={5: float("nan")}), r"logit_bias\[5\] must be a number"),
    (dict(method="ntp", logit_bias={"x": 1.0}), "logit_bias keys must be token ids"),
    (dict(method="ntp", logit_bias=[5]), "logit_bias must map token ids"),
    (dict(method="ntp", presence_penalty=2.5), "presence_penalty must be a number from -2 to 2"),
    (dict(method="ntp", frequency_penalty=float("nan")), "frequency_penalty must be a number from -2 to 2"),
    (dict(method="ntp", top_p=0.0), "top_p must be a number above 0"),
    (dict(method="ntp", top_p=1.5), "top_p must be a number above 0"),
    (dict(method="ntp", logprobs=21), "logprobs must be None or an integer from 0 to 20"),
    (dict(method="ntp", logprobs=True), "logprobs must be None or an integer"),
])
def test_bad_processing_is_one_clear_line(llama, kw, match):
    with pytest.raises(sbd.SBDError, match=match) as err:
        sbd.generate(llama, None, [[5, 6]], max_new_tokens=4, **kw)
    assert "\n" not in str(err.value)


def test_processing_defaults_and_make_row():
    assert Processing().is_default and not Processing(top_p=1).changes_logits
    assert Processing(logprobs=0).changes_logits is False and not Processing(logprobs=0).is_default
    assert Processing(logit_bias={"50": -100}).logit_bias == {50: -100.0}  # JSON keys are strings
    with pytest.raises(sbd.SBDError, match="^top_p=0.5 acts on the next-token head, read by method='ntp' and method='sbd-verify'"):
        DecodeSpec.check(method="sbd", max_new_tokens=4, processing=Processing(top_p=0.5))
    assert make_row(DecodeSpec(method="sbd", max_new_tokens=4, processing=Processing()), [5, 6],
                    mask_id=3).processing is None
    model = _model("llama")
    assert sbd.generate(model, None, [[5, 6]], method="sbd", max_new_tokens=4).logprobs is None
