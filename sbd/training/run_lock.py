"""One training run per output folder at a time.

`sbd train` holds an exclusive lock on `--out/.sbd-train.lock` for its whole life. The lock belongs to
the process (an OS file lock), so a run that crashes or is killed releases it at once and never leaves
the folder stuck; a second run on the same folder is refused with one line naming the holder.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..errors import SBDError

LOCK_FILE = ".sbd-train.lock"


@contextlib.contextmanager
def run_lock(run_dir):
    """Hold the run folder's lock for the duration of the block; SBDError if another process holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, path)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _acquire(fd: int, path: Path) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: msvcrt locks a byte range the same way
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            raise SBDError(f"another `sbd train` is writing to {str(path.parent)!r}; wait for it to finish "
                           "or choose another --out") from None
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = path.read_text().strip() or "?"
        raise SBDError(f"another `sbd train` (process {holder}) is writing to {str(path.parent)!r}; wait for it "
                       "to finish or choose another --out") from None
