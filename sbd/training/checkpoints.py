"""Atomic checkpoint directories: write everything into a staging folder, then rename it into place.

A rename within one filesystem is atomic, so `checkpoint-N` either exists complete or not at all; a
crash mid-save leaves only the staging folder, which no reader looks at and the next save clears.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

STAGING = ".checkpoint-staging"
PATTERN = re.compile(r"^checkpoint-(\d+)$")


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems do not support fsync on directories
        pass
    finally:
        os.close(fd)


def staging_dir(run_dir) -> Path:
    return Path(run_dir) / STAGING


def reset_staging(run_dir) -> Path:
    """An empty staging folder (leftovers of a crashed save are removed)."""
    path = staging_dir(run_dir)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def publish(run_dir, name: str) -> Path:
    """Move `staging/name` to `run_dir/name` atomically (replacing an older folder of that name)."""
    run_dir = Path(run_dir)
    src, dst = staging_dir(run_dir) / name, run_dir / name
    _fsync_tree(src)
    if dst.exists():  # same step saved twice: retire the old one first, then swap in the new one
        old = staging_dir(run_dir) / (name + ".old")
        os.replace(dst, old)
    os.replace(src, dst)
    _fsync_dir(run_dir)
    shutil.rmtree(staging_dir(run_dir), ignore_errors=True)
    return dst


def checkpoints(run_dir) -> list[Path]:
    """Complete checkpoints in `run_dir`, oldest step first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def damage(path) -> str | None:
    """Why checkpoint folder `path` cannot be resumed from (a truncated, missing or garbled file), or None.

    Cheap checks only: trainer_state.json parses, the weights' safetensors header and length agree, and
    optimizer.pt's zip directory (at the end of the file, so a truncated file has none) reads."""
    import json
    import zipfile

    path = Path(path)
    state = path / "trainer_state.json"
    if not state.is_file():
        return "no trainer_state.json"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return "trainer_state.json is not valid JSON"
    weights = [p for p in ("model.safetensors", "adapter_model.safetensors") if (path / p).is_file()]
    if not weights:
        return "no model.safetensors or adapter_model.safetensors"
    for name in weights:
        reason = _safetensors_damage(path / name)
        if reason:
            return f"{name} {reason}"
    opt = path / "optimizer.pt"
    if opt.exists():
        try:
            with zipfile.ZipFile(opt) as z:
                z.namelist()
        except (OSError, zipfile.BadZipFile):
            return "optimizer.pt is truncated or not a torch save file"
    return None


def _safetensors_damage(path: Path) -> str | None:
    import json
    import struct

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return "is truncated"
            n = struct.unpack("<Q", head)[0]
            if n > size - 8:
                return "is truncated"
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError):
        return "has a garbled header"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    if 8 + n + max(ends, default=0) > size:
        return "is truncated"
    return None


def latest_checkpoint(run_dir) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def latest_intact(run_dir) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that `damage` finds nothing wrong with, and the damaged newer ones."""
    damaged = []
    for path in reversed(checkpoints(run_dir)):
        reason = damage(path)
        if reason is None:
            return path, damaged
        damaged.append((path, reason))
    return None, damaged


def rotate(run_dir, keep: int | None) -> None:
    """Delete all but the newest `keep` checkpoints (None or 0 keeps all)."""
    if not keep:
        return
    for old in checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
