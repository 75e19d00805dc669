"""Prompt sets from files, registry tasks or reasoning-gym: what `sbd distill` and `sbd bench --prompts`
read, in one place."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs

from ..errors import SBDError

TASK_PREFIX = "task:"
RG_PREFIX = "reasoning-gym:"


def _query(spec: str, allowed: dict) -> tuple[str, dict]:
    name, _, query = spec.partition("?")
    params = dict(allowed)
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key not in allowed:
            raise SBDError(f"{spec!r}: unknown option {key!r} (use {', '.join(allowed)})")
        value = values[-1]
        if isinstance(allowed[key], int):
            try:
                value = int(value)
            except ValueError:
                raise SBDError(f"{spec!r}: {key} must be an integer, got {value!r}") from None
        params[key] = value
    if not name:
        raise SBDError(f"{spec!r}: give a name after the prefix")
    return name, params


def load_prompts(spec: str) -> list:
    """Prompts (strings, or lists of chat messages) from one source:
    FILE.jsonl ({"prompt": str} or {"messages": [...]} per line), FILE.txt (one prompt per line),
    task:NAME?split=train&n=N&seed=S (questions of a registry task's split, see `sbd.tasks`), or
    reasoning-gym:NAME?size=N&seed=S (questions of any reasoning-gym generator)."""
    spec = str(spec)
    if spec.startswith(TASK_PREFIX):
        from ..tasks import make_split

        name, p = _query(spec[len(TASK_PREFIX):], {"split": "train", "n": 100, "seed": 0})
        return [e["entry"]["question"] for e in make_split(name, p["split"], p["n"], p["seed"])]
    if spec.startswith(RG_PREFIX):
        import reasoning_gym

        name, p = _query(spec[len(RG_PREFIX):], {"size": 100, "seed": 0})
        try:
            return [e["question"] for e in reasoning_gym.create_dataset(name, size=p["size"], seed=p["seed"])]
        except Exception as e:  # unknown names raise ValueError, bad configs other types
            raise SBDError(f"reasoning-gym cannot create {name!r}: {e}") from None
    path = Path(spec)
    if not path.is_file():
        raise SBDError(f"prompt file {spec!r} does not exist (or use task:NAME?… / reasoning-gym:NAME?…)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise SBDError(f"prompt file {spec!r} is not UTF-8 text") from None
    if path.suffix != ".jsonl":  # one prompt per line; a literal \\n inside a line is a line break
        prompts = [line.replace("\\n", "\n") for line in lines if line.strip()]
        if not prompts:
            raise SBDError(f"prompt file {spec!r} has no prompts")
        return prompts
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise SBDError(f"{spec}:{n}: not valid JSON ({e.msg})") from None
        value = rec.get("messages", rec.get("prompt")) if isinstance(rec, dict) else None
        if not isinstance(value, (str, list)) or not value:
            raise SBDError(f"{spec}:{n}: expected a 'prompt' string or a 'messages' list")
        prompts.append(value)
    if not prompts:
        raise SBDError(f"prompt file {spec!r} has no prompts")
    return prompts
