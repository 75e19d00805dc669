"""Training data on disk: a seeded mix of tasks as prompt/completion jsonl lines."""

from __future__ import annotations

import json
import random
from pathlib import Path

from .splits import make_split


def render_jsonl(task_names, split: str, size: int, seed: int, path) -> int:
    """Write `size` examples per task of `split` to `path`, shuffled (seeded) across tasks; one JSON object
    per line with `prompt`, `completion` (the model's text is prompt + completion), `answer` and `task`.
    Returns the number of lines written."""
    if isinstance(task_names, str):
        task_names = [t for t in task_names.split(",") if t]
    rows = [{k: ex[k] for k in ("prompt", "completion", "answer", "task")}
            for task in task_names for ex in make_split(task, split, size, seed)]
    random.Random(seed).shuffle(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(rows)
