"""Scoring: always reasoning-gym's own `score_answer`, applied to the answer we extract from the text."""

from __future__ import annotations

from .format import extract_answer, final_answer
from .registry import dataset

__all__ = ["extract_answer", "final_answer", "score"]


def score(task_name: str, entry: dict, predicted_text: str, chat: bool = False) -> float:
    """reasoning-gym's score (1.0 = correct) of the final answer in `predicted_text` against `entry`
    (the reasoning-gym entry, e.g. `example["entry"]`). No answer line scores as reasoning-gym scores None.
    `chat`: a free-form reply to the bare question, read with `final_answer` (its `Answer:` line, else
    its last number)."""
    answer = final_answer(predicted_text) if chat else extract_answer(predicted_text)
    return float(dataset(task_name).score_answer(answer, entry))
