"""`python -m sbd.cli COMMAND …` (what torchrun and accelerate launch run)."""

import sys

from .main import main

sys.exit(main())
