"""Terminal output of the commands (rich): tables, and text coloured by the forward that revealed it."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

FORWARD_COLOURS = ("red", "dark_orange", "yellow", "green", "cyan", "dodger_blue1", "purple", "magenta")


def console(colour: bool | None = None, stderr: bool = False) -> Console:
    """A console on stdout (on stderr with stderr=True); colour None: only on a terminal. Piped output is 120
    columns wide (rich would assume 80 and wrap the tables)."""
    import sys

    width = None if (sys.stderr if stderr else sys.stdout).isatty() else 120
    return Console(force_terminal=colour, no_color=colour is False, highlight=False, soft_wrap=True, width=width,
                   stderr=stderr)


def print_table(header: list[str], rows: list[list], colour: bool | None = None, stderr: bool = False) -> None:
    """The first column left-aligned (row names), the others right-aligned (figures); on stderr with
    stderr=True (statistics beside answers that go to stdout)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column(header[0])
    for name in header[1:]:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console(colour, stderr).print(table)


def by_forward(pieces: list[tuple[str, int]], colour: bool) -> str:
    """Text pieces with the forward (1-based) that revealed each: one colour per forward, or `piece⟨n⟩`."""
    if not colour:
        return "".join(p.replace("\n", f"⟨{n}⟩\n") if "\n" in p else f"{p}⟨{n}⟩" for p, n in pieces)
    text = Text()
    for piece, n in pieces:
        text.append(piece, style=FORWARD_COLOURS[(n - 1) % len(FORWARD_COLOURS)])
    out = Console(force_terminal=True, color_system="256", width=10 ** 6, highlight=False, soft_wrap=True)
    with out.capture() as captured:
        out.print(text, end="")
    return captured.get()
