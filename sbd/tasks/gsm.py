"""Grade-school word problems (reasoning-gym's `gsm_symbolic`) with the worked solution the generator
ships: the task where a pretrained model has something to bring, unlike the toy arithmetic families."""

from __future__ import annotations

from .format import finish


def render_gsm_symbolic(entry: dict) -> dict:
    """The question as prompt; the generator's worked solution as the completion, its final `#### N`
    line rewritten as our `Answer: N` so the shared extractor and scorer serve this task too."""
    lines = [line.rstrip() for line in entry["metadata"]["answer_cot"].strip().splitlines()]
    if lines and lines[-1].startswith("####"):
        lines = lines[:-1]
    while lines and not lines[-1]:
        lines.pop()
    return finish(f"Question: {entry['question'].strip()}\nSolution:\n", lines, str(entry["answer"]), entry)
