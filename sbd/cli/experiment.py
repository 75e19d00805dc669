"""`sbd experiment`: the small-scale paper experiment (`sbd.experiment`), one command, resumable."""

from __future__ import annotations

from ..errors import SBDError
from ..experiment import SCALES, Experiment
from ..models.names import DEMO_DIR


def add_experiment_parser(sub) -> None:
    p = sub.add_parser("experiment", help="reproduce the paper's accuracy / forward-pass experiment at small scale",
                       description="Render seeded reasoning tasks, build a small Llama from scratch, train two "
                                   "copies for the same steps on the same data (the NTP baseline and SBD; after an "
                                   "optional shared NTP pretraining), and evaluate accuracy, forward passes and "
                                   "wall-clock time, plus the convergence check of both. Phases already complete "
                                   "in --out are skipped, so an interrupted run continues where it stopped.")
    p.add_argument("scale", choices=sorted(SCALES), help="tiny: the recorded run (~1 hour on 2 cores); tiny-h128: "
                                                         "the same with a 2x narrower model (model-size study); "
                                                         "toy: the same pipeline in seconds (for CI)")
    p.add_argument("--out", required=True, help="run folder (data, models, results)")
    p.add_argument("--ship", action="store_true",
                   help="copy the released models into the installed package as the `demo` model")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def cmd_experiment(args) -> None:
    import torch

    if args.threads is not None:
        if args.threads < 1:
            raise SBDError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    exp = Experiment(args.scale, args.out, progress=not args.no_progress)
    record = exp.run()
    print(f"phase wall times (s): {record['phase_seconds']}")
    print(f"results: {exp.path('eval')}")
    if args.ship:
        exp.ship(DEMO_DIR)
        print(f"shipped the released models to {DEMO_DIR}")
