"""Give memory back after large requests: glibc's `malloc_trim` returns the freed heap pages to the system
(without it the process keeps its peak size). Runs in a thread, one at a time, without the GIL (a ctypes
call releases it). No `gc.collect()`: a full collection holds the GIL for about half a second with a
model loaded, which would stall every request; what a request leaves behind is freed by reference
counting."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

LARGE = 256 * 1024  # request bodies at least this large are followed by a release


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl)
        return None


_TRIM = _malloc_trim()


def release() -> None:
    """Hand free heap pages back to the system (glibc only; elsewhere nothing to do)."""
    if _TRIM is not None:
        _TRIM(0)


class Releaser:
    """`after(size)` for `BodyLimit`: after a large body, one release in a background thread (a second
    large request while one runs does not start another)."""

    def __init__(self, large: int = LARGE):
        self.large = large
        self._busy = threading.Lock()

    def after(self, size: int) -> None:
        if size >= self.large and self._busy.acquire(blocking=False):
            threading.Thread(target=self._run, name="sbd-release", daemon=True).start()

    def _run(self) -> None:
        try:
            release()
        finally:
            self._busy.release()
