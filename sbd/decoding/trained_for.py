"""Which decodings a model's drafter was trained for, and what happens when a caller asks for another
(SPEC §7 "What a drafter was trained for"): no decoding runs silently where it cannot work.

- Plain SBD (`method="sbd"`) reveals tokens from the masks' own guesses: on a drafter never trained on
  partially revealed blocks it writes fluent-looking nonsense. Refused in one line when the model records
  what it was trained for and that is not among it; a loud warning when it records nothing.
- sbd-verify is exact whatever the drafter, but masks that were never trained draft tokens the model
  refuses, so every forward is wider than plain decoding's for ~1 token: a warning says so.

Where the record lives: a drafting adapter's `adapter_config.json` (`trained_for`; adapters written before
the field existed were all trained with every block position masked, i.e. for sbd-verify's drafts), a
fully fine-tuned model's `config.json` (`sbd_trained_for`, written by `sbd train`).
"""

from __future__ import annotations

import json
import warnings

from ..errors import SBDError

DECODINGS = ("sbd", "sbd-verify")

# how each interface writes a setting, so that a refusal names what the user types there
SPELLINGS = {
    "python": lambda name, value: f"{name}={value!r}",
    "cli": lambda name, value: f"--{name.replace('_', '-')}" + ("" if value is True else f" {value}"),
    "http": lambda name, value: f"{json.dumps(name)}: {json.dumps(value)}",
}
# `sbd serve`'s options: anchored SBD is a request's choice there (no --anchor option)
SPELLINGS["serve"] = lambda name, value: (f"requests with method sbd and {SPELLINGS['http'](name, value)}"
                                          if name == "anchor" else SPELLINGS["cli"](name, value))


def trained_for(model) -> frozenset[str] | None:
    """The decodings the model's drafter was trained for, or None when it records nothing."""
    from ..drafters.adapter import adapter_of

    adapter = adapter_of(model)
    if adapter is not None:
        return frozenset(adapter.config.trained_for)
    record = getattr(getattr(model, "config", None), "sbd_trained_for", None)
    if record is None:
        return None
    if not isinstance(record, (list, tuple)) or any(d not in DECODINGS for d in record):
        raise SBDError(f"the model's config.json: sbd_trained_for lists decodings among {', '.join(DECODINGS)}, "
                       f"got {record!r}")
    return frozenset(record)


def _warn_once(model, key: str, text: str) -> None:
    said = model.__dict__.setdefault("_sbd_warned", set())
    if key not in said:
        said.add(key)
        warnings.warn(text, UserWarning, stacklevel=4)


def check_decoding(model, method: str, anchor: bool = False, interface: str = "python") -> None:
    """Refuse (SBDError) or warn about a decoding the model's drafter was not trained for. Anchored plain
    SBD (`anchor`) feeds all-mask blocks only, the state sbd-verify's drafts are trained on: it asks what
    sbd-verify asks. interface ("python", "cli", "serve" or "http"): how the refusal spells the settings it
    suggests (`method='sbd-verify'`, `--method sbd-verify`, `"method": "sbd-verify"`)."""
    if method not in DECODINGS:
        return
    say = SPELLINGS[interface]
    trained = trained_for(model)
    if method == "sbd" and anchor:
        if trained is not None and not trained:
            raise SBDError("this model's masks were never trained (it records next-token decoding only): anchored "
                           f"plain SBD would reveal their guesses; use {say('method', 'ntp')} or "
                           f"{say('method', 'sbd-verify')}")
        method = "sbd-verify" if trained is None or "sbd" not in trained else "sbd"
    if method == "sbd":
        if trained is not None and "sbd" not in trained:
            verify = "sbd-verify" in trained
            what = "drafting adapter" if verify else "model"
            anchored = (f", or {say('anchor', True)} for plain SBD anchored on the model's next token (lossy: not "
                        "always its answers)") if verify else ""
            raise SBDError(f"this {what} was not trained for plain SBD decoding (it records: "
                           f"{', '.join(sorted(trained)) or 'next-token decoding only'}), which would write "
                           f"text the model never meant; use {say('method', 'sbd-verify')} (the model's own "
                           f"answers){anchored}")
        if trained is None:
            _warn_once(model, "sbd", "sbd: this model records no training for plain SBD decoding (config.json "
                                     "sbd_trained_for); if its masks were not trained on partially revealed blocks "
                                     "its answers will be nonsense: method='sbd-verify' keeps the model's own")
    elif trained is None or "sbd-verify" not in trained:
        _warn_once(model, "sbd-verify", "sbd: this model's masks were never trained for drafting (no drafting adapter "
                                        "and no sbd_trained_for in its config.json): sbd-verify stays exact but its "
                                        "drafts will mostly be refused, so it may run slower than method='ntp'")
