"""The options of a drafting-adapter run that both ways into training take (`TrainConfig`, from the command
line, and `SBDTrainer`, from Python), checked by one set of rules. Each way spells the options as its user
writes them (`CLI`, `PYTHON`), so a mistake is named in the words the user typed."""

from __future__ import annotations

import math

from ..errors import SBDError

PYTHON = {"adapter": "mode='adapter'", "kl_weight": "kl_weight", "latent_weight": "latent_weight",
          "grad_layer": "grad_layer", "position_decay": "position_decay", "head_only": "sampler_head='only'"}
CLI = {"adapter": "--adapter", "kl_weight": "--kl-weight", "latent_weight": "--latent-weight",
       "grad_layer": "--train-layers-from", "position_decay": "--position-decay", "head_only": "--sampler-head-only"}


def _number(value, least_open: bool = False) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
        value > 0 if least_open else value >= 0)


def check_adapter_options(spell: dict, *, adapter: bool, head_only: bool, kl_weight=0.0, latent_weight=0.0,
                          grad_layer=0, position_decay=None) -> None:
    """SBDError in one line for an adapter option with a value no run can use, or given to a run that does
    not read it. adapter: the run trains a drafting adapter; head_only: it trains a sampler head alone
    over a frozen adapter."""
    kl, latent, grad, decay = (spell[k] for k in ("kl_weight", "latent_weight", "grad_layer", "position_decay"))
    for name, value in ((kl, kl_weight), (latent, latent_weight)):
        if not _number(value):
            raise SBDError(f"{name} must be a number >= 0, got {value!r}")
    if not isinstance(grad_layer, int) or isinstance(grad_layer, bool) or grad_layer < 0:
        raise SBDError(f"{grad} must be an integer >= 0, got {grad_layer!r}")
    if position_decay is not None and not (_number(position_decay, least_open=True) and position_decay <= 1):
        raise SBDError(f"{decay} must lie in (0, 1], got {position_decay!r}")
    used = [n for n, on in ((kl, kl_weight), (latent, latent_weight), (grad, grad_layer),
                            (decay, position_decay is not None)) if on]
    if used and not adapter:
        verb = "applies" if len(used) == 1 else "apply"
        raise SBDError(f"{' and '.join(used)} {verb} to drafting-adapter runs only ({spell['adapter']})")
    if head_only and (kl_weight or latent_weight or grad_layer):
        raise SBDError(f"{spell['head_only']} trains no adapter: {kl}, {latent} and {grad} do not apply")
