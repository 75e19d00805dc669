"""The `sbd` console command's entry (`sbd.cli` holds the commands): Ctrl-C is taken over before anything
heavy is imported, so that an interrupt at any moment (during the imports, the work, or the way out)
prints "sbd: interrupted" and exits with status 130 (`sbd.interrupts`)."""

from __future__ import annotations

import sys

from . import interrupts


def _command_line():
    from .cli.main import main

    return main


def main(argv=None) -> int:
    return interrupts.run_command(_command_line, argv)


if __name__ == "__main__":
    sys.exit(main())
