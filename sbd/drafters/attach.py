"""How a drafter hangs on a model and comes off, the same for every kind.

A drafter is a submodule of the model under its own attribute (`model.sbd_adapter`,
`model.sbd_sampler_head`): it moves with `.to()` and its parameters reach an optimizer, while the model's
own modules and state dict stay as they were. At most one of each kind hangs on a model; `Slot` is that
attribute, and `setting` the with-block switch (the adapter's gate, the head's on/off). A saved drafter
is built and filled before it hangs, so one that is refused leaves nothing behind.
"""

from __future__ import annotations

import contextlib

from ..errors import SBDError


class Slot:
    """The attribute a kind of drafter hangs on; `what` names the kind in messages ("sampler head")."""

    def __init__(self, attribute: str, what: str):
        self.attribute, self.what = attribute, what

    def of(self, model):
        """The drafter of this kind on `model`, or None."""
        return getattr(model, self.attribute, None)

    def check_free(self, model) -> None:
        if self.of(model) is not None:
            raise SBDError(f"this model already has a {self.what} attached")

    def require(self, model, purpose: str):
        """The drafter on `model`; SBDError "this model has no <kind> <purpose>" without one."""
        drafter = self.of(model)
        if drafter is None:
            raise SBDError(f"this model has no {self.what} {purpose}")
        return drafter

    def hang(self, model, drafter) -> None:
        self.check_free(model)
        setattr(model, self.attribute, drafter)  # a submodule: moves with .to(), its parameters train

    def remove(self, model):
        """Take the drafter off `model` and return it (None when there was none)."""
        drafter = self.of(model)
        if drafter is not None:
            delattr(model, self.attribute)
        return drafter


@contextlib.contextmanager
def setting(drafter, attribute: str, value):
    """Within the block, `drafter.<attribute>` is `value` (restored after); no drafter: nothing changes."""
    if drafter is None:
        yield
        return
    previous = getattr(drafter, attribute)
    setattr(drafter, attribute, value)
    try:
        yield
    finally:
        setattr(drafter, attribute, previous)
