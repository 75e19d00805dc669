"""Scoring: always reasoning-gym's own `score_answer`, applied to the answer we extract from the text."""

from __future__ import annotations

from .format import extract_answer
from .registry import dataset

__all__ = ["extract_answer", "score"]


def score(task_name: str, entry: dict, predicted_text: str) -> float:
    """reasoning-gym's score (1.0 = correct) of the final answer in `predicted_text` against `entry`
    (the reasoning-gym entry, e.g. `example["entry"]`). No answer line scores as reasoning-gym scores None."""
    return float(dataset(task_name).score_answer(extract_answer(predicted_text), entry))
