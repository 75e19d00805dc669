"""How much a wider forward costs on this model and device: what adaptive drafting trades against.

`forward_costs(model, batch)` times forwards of a few widths over a short cache, through the engine's
own forward (`sbd.decoding.forward`: its cache, attention plan and adapter gate), and returns a function
giving the time of a w-token forward relative to a 1-token forward (interpolated between the widths
timed). On an H100 the paper's roofline puts a 16-token forward at 1.004x; on a CPU the step from 1 to
2 tokens alone can cost half a forward (a matrix-vector product becomes a matrix product), and the
cost then grows with the width. Each width's time is the median of three, widths interleaved. On this
shared 2-core machine such a table moves from one timing to the next (SmolLM2, four in a row: 1.10–1.41x
per width); the fastest of five is steadier (1.06–1.24x) but steeper, since the stalls it drops weigh
most on the short 1-token forward, and decoding pays its stalls too: with it SmolLM2 drafted shorter and
ran 1.075x slower (benchmarks/results/forward_cost_spread.md, checkouts_fastest_costs), so the median
stays. Measured once per model shape, batch size, device and machine, and
remembered: in the process, and on disk (`$SBD_CACHE/forward_costs/`, or `$SBD_COSTS_CACHE`, as autotuners keep their
measurements), so a new process starts at once; a measurement that has to be taken says so on stderr.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time
import weakref
from pathlib import Path
from typing import Callable

import torch

from .cache import slot_cache
from .forward import Feed, ModelForward

# The widths timed; a verify step with draft d is 2d + 2 wide. Both sides of every multiple of 8: narrow
# linear layers pad a forward's columns to a multiple of 8 beyond 8 (`sbd.models.narrow_linear`), so
# on SmolLM2 a 17-wide forward costs 1.2x a 16-wide one, a step a line through 9 and 17 cannot see
# (benchmarks/smollm2/results/adapter_forward_cost.md).
WIDTHS = (1, 2, 3, 4, 6, 8, 9, 16, 17, 24, 25, 33)
_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# A batch size not timed yet on a model (and machine) that was: take the costs of the nearest batch size
# timed, rather than stall the caller for seconds (a wide batched forward costs somewhat more than that
# estimate says, so drafts may run a little long; the output is the same either way).
ESTIMATE_NEW_BATCHES = True


def _timed(forward: ModelForward, feeds: list[Feed], cache, length: int) -> float:
    """Seconds of one forward of `feeds` over `length` cached positions per row, laid out as the engine
    lays out a step (the layout is part of what a step costs)."""
    if forward.device.type == "cuda":
        torch.cuda.synchronize()
    width = len(feeds[0].tokens)
    t = time.perf_counter()
    step = forward.inputs(feeds, [length] * len(feeds), width, length + width)
    forward(step, cache, logits_to_keep=width)
    if forward.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


@functools.lru_cache(maxsize=1)
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def disk_key(forward: ModelForward, batch: int, context: int, repeats: int) -> str:
    """What the costs depend on: the model's shapes (`ModelForward.shape`: config, dtype, device, narrow
    layers, a drafting adapter's rank, attention path), the threads, the processor and torch's version
    (not its weights), then the batch: `FAMILY-bBATCH`."""
    parts = [*forward.shape, str(context), str(repeats), str(torch.get_num_threads()), _cpu_name(),
             torch.__version__, str(WIDTHS)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24] + f"-b{batch}"


def _nearest_batch(key: str) -> tuple[int, dict[int, float]] | None:
    """The costs kept for the same model and machine at the nearest other batch size, if any."""
    family, batch = key.rsplit("-b", 1)
    found = []
    for path in _disk_file(family + "-b0").parent.glob(f"{family}-b*.json"):
        other = int(path.stem.rsplit("-b", 1)[1])
        costs = _read_disk(path.stem)
        if costs is not None:
            found.append((abs(math.log(other / int(batch))), other, costs))
    return min(found)[1:] if found else None


def _disk_file(key: str) -> Path:
    """$SBD_COSTS_CACHE/KEY.json, else the cache folder's forward_costs/KEY.json."""
    from ..models.loading import cache_dir

    folder = os.environ.get("SBD_COSTS_CACHE")
    return (Path(folder) if folder else cache_dir() / "forward_costs") / f"{key}.json"


def _read_disk(key: str) -> dict[int, float] | None:
    try:
        raw = json.loads(_disk_file(key).read_text())
        costs = {int(w): float(c) for w, c in raw["costs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # none yet, or unreadable: measure again
    return costs if set(costs) == set(WIDTHS) and all(c >= 1.0 for c in costs.values()) else None


def _write_disk(key: str, costs: dict[int, float]) -> None:
    path = _disk_file(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"costs": costs, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: measured again next time


def relative_costs(model, batch: int = 1, context: int = 64, repeats: int = 3) -> dict[int, float]:
    """{width: median time of a width-token forward / that of a 1-token forward} for `WIDTHS`."""
    forward = ModelForward(model)
    shape = (batch, *forward.shape)  # in this process: whatever context and repeats timed it
    known = _MEASURED.setdefault(model, {})
    if shape in known:
        return known[shape]
    stored = disk_key(forward, batch, context, repeats)
    costs = _read_disk(stored)
    near = _nearest_batch(stored) if costs is None and ESTIMATE_NEW_BATCHES else None
    if near is not None:  # a new batch size on a model timed before: no stall, its nearest batch's costs
        costs = near[1]
    elif costs is None:
        print(f"sbd: timing forwards of {len(WIDTHS)} widths at batch {batch} for adaptive drafting (once per model "
              "shape, batch size and machine; kept in the cache folder)", file=sys.stderr, flush=True)
        costs = _measure(forward, batch, context, repeats)
        _write_disk(stored, costs)
    known[shape] = costs
    return costs


def _measure(forward: ModelForward, batch: int, context: int, repeats: int, pick=statistics.median) -> dict[int, float]:
    """Time verify-shaped forwards (w tokens, the first w/2 committed, the rest a block under the adapter's
    gate) of each width over `context` cached tokens per row, widths interleaved; the scratch they write
    is overwritten by the next (the rows' lengths stay at `context`). pick: how a width's `repeats` times
    become one (the median; benchmarks/forward_cost_spread.py compares the fastest)."""
    vocab = forward.model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    cache = slot_cache(forward.model, batch, context, max(WIDTHS))

    def feeds(w: int, n_commit: int) -> list[Feed]:
        return [Feed(torch.randint(0, vocab, (w,), generator=g).tolist(), n_commit, w) for _ in range(batch)]

    times: dict[int, list[float]] = {w: [] for w in WIDTHS}
    with torch.inference_mode():
        _timed(forward, feeds(context, context), cache, 0)  # the prompt
        inputs = {w: feeds(w, max(w // 2, 1)) for w in WIDTHS}
        for w in WIDTHS:  # warm-up
            _timed(forward, inputs[w], cache, context)
        for _ in range(repeats):  # widths interleaved
            for w in WIDTHS:
                times[w].append(_timed(forward, inputs[w], cache, context))
    one = pick(times[1])
    costs = {w: max(1.0, pick(t) / one) if w > 1 else 1.0 for w, t in times.items()}
    wider = float("inf")
    for w in sorted(costs, reverse=True):  # a forward never costs more than a wider one: timing noise out
        costs[w] = wider = min(costs[w], wider) if w > 1 else 1.0
    return costs


def forward_costs(model, batch: int = 1) -> Callable[[int], float]:
    """A function: width → time of such a forward relative to a 1-token forward (linear between the
    widths timed, extended linearly beyond the widest)."""
    return interpolate(relative_costs(model, batch))


def interpolate(costs: dict[int, float]) -> Callable[[int], float]:
    widths = sorted(costs)

    def cost(w: int) -> float:
        if w <= widths[0]:
            return costs[widths[0]]
        i = min(bisect.bisect_left(widths, w), len(widths) - 1)
        a, b = widths[i - 1], widths[i]
        return costs[a] + (costs[b] - costs[a]) * (w - a) / (b - a)
    return cost
