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


class Progress:
    """Progress of a long command on stderr: a bar on a terminal; otherwise (a log, CI) a line at most every
    `every` seconds and at the end, so that a slow machine shows it is working without flooding the log."""

    def __init__(self, total: int, what: str, every: float = 5.0):
        import sys
        import time

        self.total, self.what, self.every, self.done = total, what, every, 0
        self._clock, self._stream = time.monotonic, sys.stderr
        self._start = self._last = self._clock()
        self._bar = None
        if self._stream.isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=what, unit="answer", leave=False, file=self._stream)

    def update(self, note: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
            if self.done == self.total:
                self._bar.close()
            return
        now = self._clock()
        if now - self._last >= self.every or self.done == self.total:
            self._last = now
            print(f"sbd: {self.what}: {self.done}/{self.total} ({now - self._start:.0f} s){note}",
                  file=self._stream, flush=True)
