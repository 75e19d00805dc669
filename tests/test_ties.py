"""Near ties (sbd/benchmarking/ties.py): where two greedy answers part, the model's logit gap between the
two tokens they chose, and a benchmark that names answers parting at a near tie without hiding a real
difference behind one."""

from __future__ import annotations

import importlib

import torch
from conftest import _model, hf_greedy, random_prompts

from sbd.benchmarking import bench, parse_methods
from sbd.benchmarking import ties
from sbd.benchmarking.report import bench_markdown
from sbd.benchmarking.ties import first_difference, near_ties, parting_gap


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2 and first_difference([4], []) == 0


def _runner_up_answer(model, prompt, ref, at):
    """`ref` with its token at `at` swapped for the model's second choice there; and the true gap."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ref[:at]], device=model.device)).logits[0, -1]
    top = torch.topk(logits, 2)
    assert top.indices[0] == ref[at]
    return ref[:at] + [int(top.indices[1])] + ref[at + 1:], float(top.values[0] - top.values[1])


def test_parting_gap_is_the_models_logit_gap_where_answers_part():
    model = _model("llama")
    prompt = random_prompts(1, model.config.vocab_size, lengths=(7,))[0]
    ref = hf_greedy(model, prompt, 12)
    other, gap = _runner_up_answer(model, prompt, ref, 4)
    assert abs(parting_gap(model, prompt, ref, other) - gap) < 1e-4
    assert parting_gap(model, prompt, ref, list(ref)) is None
    assert parting_gap(model, prompt, ref, ref[:5]) is None  # one stops where the other goes on
    assert near_ties(model, [prompt], [other], [ref], gap=gap * 1.01) == 1
    assert near_ties(model, [prompt], [other], [ref], gap=gap * 0.99) == 0
    assert near_ties(model, [prompt], [ref], [ref], gap=1e9) == 0  # identical answers are not ties


def test_bench_names_near_ties_and_still_flags_other_differences(monkeypatch):
    """A lossless row whose answer parts from greedy's: counted as a near tie (no ✗) only when the gap is
    under the tie threshold; otherwise the row is flagged."""
    bench_module = importlib.import_module("sbd.benchmarking.bench")
    model = _model("llama")
    prompts = random_prompts(2, model.config.vocab_size, lengths=(6, 9))
    decode = bench_module._decode

    def altered(m, model_, tokenizer, batch, *rest):
        tokens, nfe = decode(m, model_, tokenizer, batch, *rest)
        if m.kind == "sbd-verify" and batch[0] == prompts[0]:
            tokens = [_runner_up_answer(model_, batch[0], tokens[0], 2)[0]] + tokens[1:]
        return tokens, nfe

    monkeypatch.setattr(bench_module, "_decode", altered)
    methods = parse_methods("hf,sbd-verify", [], 4, assistant=False)
    for threshold, ties_seen in ((1e9, 1), (0.0, 0)):
        monkeypatch.setattr(ties, "TIE_GAP", threshold)
        result = bench(model, None, prompts, methods, repeats=1, max_new_tokens=8, limit_repeats=1, progress=False)
        row = next(r for r in result.rows if r.kind == "sbd-verify")
        assert (row.same_as_greedy, row.near_ties) == (1, ties_seen)
        line = next(l for l in bench_markdown(result).splitlines() if l.startswith(f"| {row.method} |"))
        assert ("(+1 near tie)" in line, "✗" in line) == ((True, False) if ties_seen else (False, True))


def test_the_tie_gap_follows_the_precision_the_model_computes_in():
    assert ties.tie_gap(torch.float32) == ties.TIE_GAP < ties.tie_gap(torch.float16) < ties.tie_gap(torch.bfloat16)
