"""Worked solutions for the arithmetic families: each step reduces one operation, so a small model
only ever has to do one small sum or product at a time."""

from __future__ import annotations

from .format import finish

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def render_chain_sum(entry: dict) -> dict:
    """`12 + 5 - 3` -> a running-sum scratchpad `12 + 5 = 17`, `17 - 3 = 14`, `Answer: 14`."""
    tokens = entry["metadata"]["expression"].split()
    total, lines = int(tokens[0]), []
    for op, term in zip(tokens[1::2], tokens[2::2]):
        new = _OPS[op](total, int(term))
        lines.append(f"{total} {op} {term} = {new}")
        total = new
    return finish(f"Add up: {' '.join(tokens)}\n", lines, str(total), entry)


def _unwrap(tokens: list[str]) -> list[str]:
    """Drop brackets around a single number: `( 5 )` -> `5`, `-( 5 )` -> `-5`."""
    changed = True
    while changed:
        changed = False
        for i in range(len(tokens) - 2):
            if tokens[i] in ("(", "-(") and tokens[i + 2] == ")":
                value = int(tokens[i + 1]) * (-1 if tokens[i] == "-(" else 1)
                tokens = tokens[:i] + [str(value)] + tokens[i + 3:]
                changed = True
                break
    return tokens


def _next_span(tokens: list[str]) -> tuple[int, int]:
    """Bounds (lo, hi) of the innermost bracket group, or of the whole expression when there is none."""
    lo, hi = 0, len(tokens)
    for i, t in enumerate(tokens):
        if t in ("(", "-("):
            lo = i + 1
        elif t == ")":
            return lo, i
    return lo, hi


def expression_steps(expression: str) -> tuple[list[str], int]:
    """Reduce an expression of integers, + - * and brackets one operation at a time (brackets first, then
    * before + and -, left to right). Returns the step lines and the value."""
    tokens, lines = _unwrap(expression.split()), []
    while len(tokens) > 1:
        lo, hi = _next_span(tokens)
        ops = [i for i in range(lo + 1, hi, 2) if tokens[i] == "*"] or list(range(lo + 1, hi, 2))
        i = ops[0]
        a, op, b = tokens[i - 1], tokens[i], tokens[i + 1]
        value = _OPS[op](int(a), int(b))
        tokens = _unwrap(tokens[:i - 1] + [str(value)] + tokens[i + 2:])
        rest = f"; now {' '.join(tokens)}" if len(tokens) > 1 else ""
        lines.append(f"{a} {op} {b} = {value}{rest}")
    return lines, int(tokens[0])


def render_basic_arithmetic(entry: dict) -> dict:
    """`2 + -3 * -8` -> `-3 * -8 = 24; now 2 + 24`, `2 + 24 = 26`, `Answer: 26`."""
    expression = entry["metadata"]["expression"]
    lines, value = expression_steps(expression)
    return finish(f"Calculate: {expression}\n", lines, str(value), entry)
