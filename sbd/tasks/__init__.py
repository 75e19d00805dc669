"""Seeded reasoning tasks from `reasoning-gym`, rendered as prompt -> short worked solution.

`sbd experiment` trains and evaluates on these: a completion is a scratchpad that ends in a line
`Answer: X`, long enough (>= 24 tokens) that 16-token SBD blocks have room to work, and accuracy is
always reasoning-gym's own `score_answer` on the extracted X.
"""

from .answers import extract_answer, final_answer, score
from .export import render_jsonl
from .registry import TASKS, TaskSpec, get_task
from .splits import check_disjoint, make_split

__all__ = ["TASKS", "TaskSpec", "get_task", "make_split", "check_disjoint", "extract_answer", "final_answer", "score",
           "render_jsonl"]
