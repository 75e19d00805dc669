"""The one completion layout every task shares: step lines, then `Answer: X` on the last line, so that a
single extractor serves all tasks."""

from __future__ import annotations

import re

ANSWER_PREFIX = "Answer:"
_ANSWER = re.compile(r"Answer:[ \t]*([^\n]*)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def finish(prompt: str, lines: list[str], answer: str, entry: dict) -> dict:
    """Assemble a rendered example; `entry` is kept so the example can be scored later."""
    completion = "\n".join([*lines, f"{ANSWER_PREFIX} {answer}"])
    return {"prompt": prompt, "completion": completion, "answer": answer, "entry": entry}


def extract_answer(completion_text: str) -> str | None:
    """The text after the first `Answer:` up to the end of its line (or a special token), stripped;
    None when there is no answer line or it is empty."""
    match = _ANSWER.search(completion_text or "")
    if match is None:
        return None
    answer = match.group(1).split("<|", 1)[0].strip()
    return answer or None


def final_answer(text: str) -> str | None:
    """The answer a free-form (chat) reply ends on: its `Answer:` line when it has one, else the last
    number it writes (thousands commas and a trailing `.0` dropped: "1,200.00" -> "1200"), as GSM-style
    evaluations of chat models read them. None when the reply has neither."""
    answer = extract_answer(text)
    if answer is not None:
        return answer
    numbers = _NUMBER.findall((text or "").split("<|", 1)[0])
    if not numbers:
        return None
    number = numbers[-1].replace(",", "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return number or None
