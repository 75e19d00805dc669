"""The one completion layout every task shares: step lines, then `Answer: X` on the last line, so that a
single extractor serves all tasks."""

from __future__ import annotations

import re

ANSWER_PREFIX = "Answer:"
_ANSWER = re.compile(r"Answer:[ \t]*([^\n]*)")


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
