"""The task layer: worked solutions are right by reasoning-gym's own scorer, wrong answers are not,
splits are seeded and disjoint, and completions are long enough for 16-token blocks."""

from __future__ import annotations

import json

import pytest

from sbd.models import tiny
from sbd.errors import SBDError
from sbd.tasks import TASKS, check_disjoint, extract_answer, get_task, make_split, render_jsonl, score

N_TRAIN, N_TEST = 300, 100


@pytest.fixture(scope="module")
def splits():
    return {t: (make_split(t, "train", N_TRAIN, seed=0), make_split(t, "test", N_TEST, seed=0)) for t in TASKS}


def test_at_least_three_families():
    assert len(TASKS) >= 3


@pytest.mark.parametrize("task", list(TASKS))
def test_worked_solutions_score_one(task, splits):
    train, test = splits[task]
    for ex in train + test:
        assert ex["completion"].endswith(f"Answer: {ex['answer']}")
        assert extract_answer(ex["completion"]) == ex["answer"]
        assert score(task, ex["entry"], ex["completion"]) == 1.0, ex


def _wrong(task: str, answer: str) -> str:
    if task in ("chain_sum", "basic_arithmetic", "gsm_symbolic"):
        return str(int(answer) + 10)
    if task == "number_sorting":
        return answer.rsplit(",", 1)[0] + "]"  # one number short
    return answer.rsplit(",", 1)[0]  # one word short


@pytest.mark.parametrize("task", list(TASKS))
def test_wrong_or_missing_answers_score_below_one(task, splits):
    for ex in splits[task][1][:20]:
        assert score(task, ex["entry"], f"Answer: {_wrong(task, ex['answer'])}") < 1.0
        assert score(task, ex["entry"], "no answer line here") < 1.0


def test_extract_answer():
    assert extract_answer("1 + 2 = 3\nAnswer: 3") == "3"
    assert extract_answer("Answer:  [1, 2]<|endoftext|>junk") == "[1, 2]"
    assert extract_answer("Answer: 5\nAnswer: 6") == "5"
    assert extract_answer("Answer:") is None
    assert extract_answer("no answer") is None


@pytest.mark.parametrize("task", list(TASKS))
def test_splits_seeded_unique_and_disjoint(task, splits):
    train, test = splits[task]
    assert [e["prompt"] for e in make_split(task, "test", N_TEST, seed=0)] == [e["prompt"] for e in test]
    assert [e["prompt"] for e in make_split(task, "test", N_TEST, seed=1)] != [e["prompt"] for e in test]
    for part in (train, test):
        assert len({e["entry"]["question"] for e in part}) == len(part)
    check_disjoint(train, test)
    check_disjoint(make_split(task, "train", N_TRAIN, seed=7), test)  # any train seed is disjoint too
    with pytest.raises(SBDError):
        check_disjoint(train, train[:1])


def test_unknown_task_and_split():
    with pytest.raises(SBDError, match="unknown task 'nope'; choose from chain_sum"):
        get_task("nope")
    with pytest.raises(SBDError):
        make_split("nope", "train", 1)
    with pytest.raises(SBDError):
        make_split("chain_sum", "valid", 1)


def test_mean_completion_length(splits):
    texts = [e["prompt"] + e["completion"] for tr, te in splits.values() for e in tr + te]
    tok = tiny.build_tokenizer(texts, vocab_size=512)
    for task, (train, _) in splits.items():
        lengths = [len(tok(e["completion"])["input_ids"]) for e in train]
        assert sum(lengths) / len(lengths) >= 24, task


def test_render_jsonl(tmp_path):
    path = tmp_path / "train.jsonl"
    names = list(TASKS)
    assert render_jsonl(names, "train", 5, 0, path) == 5 * len(names)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["task"] for r in rows} == set(names)
    for r in rows:
        assert set(r) == {"prompt", "completion", "answer", "task"}
        assert r["prompt"].endswith("\n") and extract_answer(r["completion"]) == r["answer"]
    render_jsonl(names, "train", 5, 0, tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_text() == path.read_text()
