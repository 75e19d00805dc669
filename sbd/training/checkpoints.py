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


def latest_checkpoint(run_dir) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def rotate(run_dir, keep: int | None) -> None:
    """Delete all but the newest `keep` checkpoints (None or 0 keeps all)."""
    if not keep:
        return
    for old in checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
