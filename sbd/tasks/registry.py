"""The task registry: which reasoning-gym datasets we use, at what (small) difficulty, and how each entry
is rendered. Difficulty is set so a 1-5M parameter model can learn a task from a few thousand examples."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

from ..errors import SBDError
from .arithmetic import render_basic_arithmetic, render_chain_sum
from .gsm import render_gsm_symbolic
from .lists import render_number_sorting, render_word_sequence_reversal


@dataclass(frozen=True)
class TaskSpec:
    """A task: the reasoning-gym dataset name, its config (difficulty), and the entry renderer."""

    name: str
    dataset: str
    config: dict = field(default_factory=dict)
    render: Callable[[dict], dict] | None = None
    description: str = ""


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("chain_sum", "chain_sum", dict(min_terms=4, max_terms=5, min_digits=1, max_digits=2),
                 render_chain_sum, "add and subtract 4-5 numbers of 1-2 digits; running-sum scratchpad"),
        TaskSpec("basic_arithmetic", "basic_arithmetic",
                 dict(min_terms=3, max_terms=4, min_digits=1, max_digits=1, operators=("+", "-", "*"),
                      allow_parentheses=True, allow_negation=False),
                 render_basic_arithmetic, "+ - * and brackets over signed 1-digit numbers; one step per operation"),
        TaskSpec("number_sorting", "number_sorting",
                 dict(min_numbers=3, max_numbers=5, min_decimals=0, max_decimals=0, min_value=0, max_value=99),
                 render_number_sorting, "sort 3-5 integers 0-99 up or down; the list grows one pick at a time"),
        TaskSpec("word_sequence_reversal", "word_sequence_reversal", dict(min_words=3, max_words=5),
                 render_word_sequence_reversal, "reverse a list of 3-5 words; numbered, then counted back down"),
        TaskSpec("gsm_symbolic", "gsm_symbolic", dict(size=50_000),
                 render_gsm_symbolic, "grade-school word problems (GSM8K templates) with worked solutions; "
                 "for pretrained models"),
    )
}


def get_task(name: str) -> TaskSpec:
    """The spec of a known task; an unknown name is an SBDError listing the known ones."""
    if name not in TASKS:
        raise SBDError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name]


@functools.lru_cache(maxsize=64)
def dataset(name: str, seed: int = 0):
    """The reasoning-gym dataset of a task at its configured difficulty (cached: some load word lists)."""
    import reasoning_gym

    spec = get_task(name)
    return reasoning_gym.create_dataset(spec.dataset, **{"size": 1, **spec.config, "seed": seed})
