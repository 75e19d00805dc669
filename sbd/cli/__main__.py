"""`python -m sbd.cli COMMAND …` (what torchrun and accelerate launch run), under the same Ctrl-C rule as
the `sbd` command (`sbd.interrupts`)."""

import sys

from .. import interrupts
from .main import main

sys.exit(interrupts.run_command(lambda: main))
