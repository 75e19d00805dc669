"""Seeded, disjoint train / held-out splits.

Each question is assigned to train or test by a stable hash of its text, so no held-out question can
appear in any train split, whatever the sizes and seeds. Within a split, questions are unique. The two
splits also draw from different reasoning-gym seeds derived from (task, split, seed).
"""

from __future__ import annotations

import hashlib

from ..errors import SBDError
from .registry import dataset, get_task

SPLITS = ("train", "test")
TEST_SHARE = 5  # one question in 5 belongs to the held-out side of the partition
MAX_DRAWS_PER_EXAMPLE = 50


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def split_of(question: str) -> str:
    """Which side of the train/test partition a question belongs to (deterministic, seed-independent)."""
    return "test" if _digest(question) % TEST_SHARE == 0 else "train"


def split_seed(task: str, split: str, seed: int) -> int:
    """The reasoning-gym seed for one (task, split, seed): train and test never share a seed."""
    return _digest(f"{task}/{split}/{seed}") % (2**31)


def make_split(task: str, split: str = "train", size: int = 1000, seed: int = 0) -> list[dict]:
    """`size` rendered examples ({prompt, completion, answer, entry, task}) of `task` with unique questions,
    all from the `split` side of the partition; the same arguments always give the same list."""
    spec = get_task(task)
    if split not in SPLITS:
        raise SBDError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    if size < 0:
        raise SBDError(f"split size must be >= 0, got {size}")
    ds = dataset(task, split_seed(task, split, seed))
    out, seen = [], set()
    for idx in range(MAX_DRAWS_PER_EXAMPLE * size + 100):
        if len(out) == size:
            return out
        try:
            entry = ds[idx]
        except IndexError:  # the generator's dataset is finite
            break
        question = entry["question"]
        if question in seen or split_of(question) != split:
            continue
        seen.add(question)
        out.append({"task": task, **spec.render(entry)})
    if len(out) < size:
        raise SBDError(f"task {task!r} has too few distinct {split} questions for {size} examples "
                       f"(found {len(out)}); ask for fewer or widen its difficulty")
    return out


def check_disjoint(train: list[dict], test: list[dict]) -> None:
    """Raise SBDError if any held-out question also appears in the train examples."""
    shared = {e["entry"]["question"] for e in train} & {e["entry"]["question"] for e in test}
    if shared:
        raise SBDError(f"{len(shared)} held-out questions also appear in the train split, "
                       f"e.g. {next(iter(shared))!r}")
