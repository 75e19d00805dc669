"""`eval_mode`: run a block with the model in eval mode and give it back in the mode it came in."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def eval_mode(model):
    """Switch to eval mode only when the model is training: `Module.train()` walks every submodule
    (about 1 ms on a small Llama on CPU), which a decoding call should not pay when nothing changes."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield model
    finally:
        if was_training:
            model.train()
