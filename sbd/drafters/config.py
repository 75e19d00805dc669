"""The typed config base of a drafter: one JSON file in its folder, read back into a dataclass.

A subclass is a dataclass whose fields are the file's keys; it names its file and the key/value that says
what kind of drafter the file describes (a folder may hold several drafters, and peft must not mistake
ours for its own), and validates its fields in `__post_init__` with one-line `SBDError`s. Keys the class
does not know are dropped, so a folder written by a newer version still loads.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import ClassVar

from ..errors import SBDError


class DrafterConfig:
    """Base of a drafter's config dataclass (see the module docstring). The refusals are format strings a
    subclass words for its kind: `{folder}`, `{path}`, `{error}`, `{kind}` (the kind the file names)."""

    FILE: ClassVar[str]  # the config's file name in the folder
    KIND_KEY: ClassVar[str]  # the key that names the kind of drafter, and its value
    KIND: ClassVar[str]
    MISSING: ClassVar[str | None] = None  # no file; None: it is UNREADABLE like any other
    UNREADABLE: ClassVar[str] = "{path}: not valid JSON ({error})"
    OTHER_KIND: ClassVar[str] = "{path} does not describe an sbd drafter"

    @classmethod
    def read(cls, folder):
        """The config saved in `folder`; SBDError for a folder that holds none, or another kind's."""
        path = Path(folder) / cls.FILE
        if cls.MISSING is not None and not path.is_file():
            raise SBDError(cls.MISSING.format(folder=str(folder)))
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SBDError(cls.UNREADABLE.format(path=path, error=e)) from None
        if not isinstance(raw, dict) or raw.get(cls.KIND_KEY) != cls.KIND:
            kind = raw.get(cls.KIND_KEY) if isinstance(raw, dict) else None
            raise SBDError(cls.OTHER_KIND.format(path=path, kind=kind))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def write(self, folder) -> None:
        (Path(folder) / self.FILE).write_text(json.dumps(asdict(self), indent=1))
