"""A checkout must fit what a GPU machine accepts: a device call carries the working tree, at most 64 MiB,
and a wheel or two ride along. Tracked files are held to 48 MiB so that there is always room; an artefact
that nothing ships or tests leaves the tree, and the docs that named it say which commit holds it."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 48 * 2**20


def tracked_sizes() -> dict[str, int]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"not a git checkout ({err}): nothing to measure")
    names = [n for n in out.decode().split("\0") if n]
    return {n: (ROOT / n).stat().st_size for n in names if (ROOT / n).is_file()}


def test_tracked_files_fit_a_gpu_call_with_room_for_a_wheel():
    sizes = tracked_sizes()
    total = sum(sizes.values())
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    listing = ", ".join(f"{n} {s / 2**20:.1f} MiB" for n, s in biggest)
    assert total <= LIMIT, f"tracked files {total / 2**20:.1f} MiB > 48 MiB; the largest: {listing}"
