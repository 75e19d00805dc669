"""Worked solutions for the list families: the answer is built up one element at a time, so each step is
a copy a small model can learn."""

from __future__ import annotations

from .format import finish


def _number(text: str) -> str:
    """reasoning-gym writes integers as floats (`56.0`); show them as `56`."""
    value = float(text)
    return str(int(value)) if value.is_integer() else text


def render_number_sorting(entry: dict) -> dict:
    """`Sort ascending: 56, 25, 75` -> the sorted list growing one pick at a time, then `Answer: [25, 56, 75]`."""
    meta = entry["metadata"]
    numbers = [_number(n) for n in meta["original_numbers"]]
    descending = meta["direction"] == "descending"
    ordered = sorted(numbers, key=float, reverse=descending)
    lines = [f"pick {x}: [{', '.join(ordered[:i + 1])}]" for i, x in enumerate(ordered)]
    prompt = f"Sort {meta['direction']}: {', '.join(numbers)}\n"
    return finish(prompt, lines, f"[{', '.join(ordered)}]", entry)


def render_word_sequence_reversal(entry: dict) -> dict:
    """`Reverse the words: a, b, c` -> numbered words, the numbers counted back down, `Answer: c, b, a`."""
    words = entry["metadata"]["words"]
    numbered = [f"{i} {w}" for i, w in enumerate(words, 1)]
    lines = [", ".join(numbered), ", ".join(reversed(numbered))]
    return finish(f"Reverse the words: {', '.join(words)}\n", lines, ", ".join(reversed(words)), entry)
