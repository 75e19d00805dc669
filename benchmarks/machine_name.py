"""The CPU a benchmark ran on, for its result file's header (`/proc/cpuinfo`'s model name)."""

from __future__ import annotations

import platform


def machine() -> str:
    try:
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
        return f"{names[0]} ({len(names)} logical CPUs)"
    except (OSError, IndexError):
        return platform.processor() or platform.machine()
