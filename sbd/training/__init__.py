"""SBD fine-tuning (docs/method.md §2): collator, loss, data sources, atomic checkpoints and the Trainer.

`SBDTrainer` is imported lazily: `transformers.Trainer` takes seconds to import, and the collator and
the loss do not need it.
"""

from .collator import SBDDataCollator
from .loss import LossParts, sbd_loss

__all__ = ["LossParts", "SBDDataCollator", "SBDTrainer", "sbd_loss", "sbd_training_args"]


def __getattr__(name):
    if name in ("SBDTrainer", "sbd_training_args"):
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
