"""How much a wider step costs on this model and machine, learnt from the engine's own steps: what
adaptive drafting trades against.

A draft of d tokens is worth its expected tokens over the time of the wider step that verifies it
(`sbd.decoding.draft_lengths`). `forward_costs(model, batch)` gives that time relative to a one-token step
as a `StepCost`: a function (width → relative time) that the engine feeds with the wall time of every
decoding step it runs (`StepCost.add`: from the forward to the one host read of its results, so the
loop's own cost counts). Per width, the median of the last 15 steps of that width, so a stall of the
machine moves no estimate; between measured widths, linear; elsewhere the prior's shape, scaled from the
nearest measured width. Every width is priced against the one-token step, so when none has been
measured lately the cost asks the rows for one (`StepCost.plain`: no draft, no masks; a few steps in 16
until it has a median, then in 512).

Steps that feed masks are timed apart (`StepCost.masks`, read for mask drafts; a lookup draft is priced from
the steps without): the drafting adapter runs only in them, and on quantized weights on a CPU it makes such
a step ~0.5 one-token steps dearer than one of the same width without masks.

The prior needs no timing: the estimate remembered from earlier runs of the same model shape, batch size
and machine (`$SBD_CACHE/step_costs/`, or `$SBD_COSTS_CACHE`), each run's medians averaged into it; else
a default line, 1 + slope·(w − 1) (`DEFAULT_SLOPE`: 0.15 on a CPU, where SmolLM2's 16-token forward costs
2.7–3.0 one-token forwards, and 0.01 on a GPU, where the paper's roofline puts it at 1.004). No call waits
for forwards to be timed: the first call drafts by the prior, and its steps correct it.

Before, a table of 12 widths was timed before the first call of each model, batch size and machine: the
first `sbd.generate` on SmolLM2 at batch 4 waited 104 s for it on a busy 2-core machine, and the table kept
whatever the machine did in that minute (timed four times on one quiet machine: 2.3x to 3.4x for 16 tokens,
benchmarks/results/forward_cost_spread.md).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import os
import platform
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Callable

import torch

from .forward import ModelForward

DEFAULT_SLOPE = {"cpu": 0.15, "cuda": 0.01}  # the prior's extra cost per extra token, by device type
KEEP = 15  # steps per width the median runs over
LEAST = 3  # steps of a width before its median counts
SAVE_EVERY = 512  # steps between two writes of the estimate to disk (and at the end of every generate call)
PLAIN_GAP = (16, 512)  # steps between asks for plain steps: while the one-token step has no median, and after
PLAIN_ASK = 3  # steps an ask lasts (rows decide their next feeds a step ahead; a draft under way finishes first)
_COSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {batch: StepCost}


class StepCost:
    """Step time by width, from an engine's own steps (module docstring): call it with a width for the
    time relative to a one-token step; `add` what a step took. Both engines hold it: sbd's (one per model
    and batch size, `forward_costs`) and the vLLM proposer (`time`, `near` and `for_batch` for a batch's
    total width; a `fallback` read while its own kind of step is unmeasured).

    prior: width -> relative time (1.0 at width 1); default 1 + prior_slope·(w − 1). path/stored: where the
    estimate is kept on disk and what it held (`save`)."""

    def __init__(self, prior: Callable[[int], float] | None = None, path: Path | None = None,
                 stored: dict[int, float] | None = None, *, prior_slope: float = 0.05,
                 fallback: "StepCost | None" = None):
        self.prior = prior if prior is not None else (lambda w: 1.0 + prior_slope * (w - 1))
        self.fallback = fallback
        self.path, self.stored = path, dict(stored or {})  # where the estimate is kept, and what it held at start
        self._samples: dict[int, deque] = {}
        self._median: dict[int, float] = {}
        self._known: list[int] = []  # widths with a median, sorted
        self._memo: dict[int, float] = {}
        self._unsaved = 0
        self._since_plain = 0  # steps since the last one-token step
        self.plain = False  # rows, please feed no draft and no masks now: a one-token step to measure
        self.rows = 1  # rows its latest step decoded at once (`forward_costs` starts it at its batch; the engine keeps it)
        self._with_masks: StepCost | None = None  # steps that fed masks, timed apart (`masks`)

    def add(self, width: int, seconds: float, masks: bool = False) -> None:
        """One decoding step of `width` columns took `seconds`; masks: it fed masks (then the drafting
        adapter ran too: such a step is timed apart, `masks`)."""
        if width < 1 or not math.isfinite(seconds) or seconds <= 0:
            return
        # Every width is priced relative to the one-token step, which adaptive drafts rarely run on their
        # own: ask every row for one now and then (at most PLAIN_ASK steps in PLAIN_GAP).
        self._since_plain = 0 if width == 1 else self._since_plain + 1
        gap = PLAIN_GAP[1 in self._median]
        self.plain = self._since_plain % gap >= gap - PLAIN_ASK
        if masks:
            if self._with_masks is None:
                self._with_masks = StepCost(self.prior)
            self._with_masks._sample(width, seconds)
            return
        self._sample(width, seconds)
        self._unsaved += 1
        if self._unsaved >= SAVE_EVERY:
            self.save()

    def _sample(self, width: int, seconds: float) -> None:
        """One step's time in the record of its width (the median of the last KEEP)."""
        q = self._samples.setdefault(width, deque(maxlen=KEEP))
        q.append(seconds)
        if len(q) >= LEAST:
            s = sorted(q)
            self._median[width] = s[len(s) // 2]
            if width not in self._known:
                bisect.insort(self._known, width)
            self._memo.clear()
            if self._with_masks is not None:  # its prices are relative to this record's one-token step
                self._with_masks._memo.clear()

    def seconds(self, w: int) -> float | None:
        """The time of a `w`-wide step from the steps measured (None before any width has a median)."""
        known = self._known
        if not known:
            return None
        if w in self._median:
            return self._median[w]
        j = bisect.bisect_left(known, w)
        if 0 < j < len(known):
            lo, hi = known[j - 1], known[j]
            return self._median[lo] + (self._median[hi] - self._median[lo]) * (w - lo) / (hi - lo)
        near = known[0] if j == 0 else known[-1]
        return self._median[near] * self.prior(w) / self.prior(near)

    def time(self, w: int) -> float:
        """The time of a `w`-wide step: seconds once a width is measured; before, the fallback's, else the
        prior's (relative units)."""
        t = self.seconds(w)
        if t is not None:
            return t
        return self.fallback.time(w) if self.fallback is not None else self.prior(w)

    def known(self, w: int) -> bool:
        return w in self._median

    def near(self, w: int, within: float = 0.25) -> bool:
        """Whether a width within `within`·w of w (w itself at w = 1) is measured: then `time(w)` reads
        it from there instead of a step going plain to measure w itself."""
        if w in self._median:
            return True
        if w <= 1:
            return False
        span = max(1, int(w * within))
        j = bisect.bisect_left(self._known, w - span)
        return j < len(self._known) and self._known[j] <= w + span

    def for_batch(self, batch: int, wide: "StepCost | None" = None):
        """The cost function sbd's rules read for one request of a batch of `batch` requests whose steps
        this records by total width: width w of this request -> step time relative to a plain step, scaled
        to the whole batch's delay (1 + B·(T(B − 1 + w)/T(B) − 1)). wide: where the widened step's time is
        read when it is another kind of step (a forward with masks, against a plain one)."""
        base, memo = self.time(batch), {}
        timer = self.time if wide is None else wide.time

        def cost(w):
            c = memo.get(w)
            if c is None:
                c = memo[w] = 1.0 + batch * max(0.0, timer(batch - 1 + w) / base - 1.0) if w > 1 else 1.0
            return c
        return cost

    def __call__(self, w: int) -> float:
        c = self._memo.get(w)
        if c is None:
            one = self.seconds(1)
            c = self.prior(w) if one is None else 1.0 if w <= 1 else max(1.0, self.seconds(w) / one)
            self._memo[w] = c
        return c

    @property
    def masks(self) -> "MaskSteps":
        """The cost of a step that feeds masks (a mask draft's): its width's median among such steps over
        the one-token step's, where both are measured, else this cost's. On quantized weights on a CPU a
        step with masks costs ~0.5 one-token steps more than one of the same width without (the drafting
        adapter), so a lookup draft and a mask draft of one width are not priced alike."""
        return MaskSteps(self)

    def measured(self) -> dict[int, float]:
        """{width: relative time} at the widths this process measured."""
        return {w: self(w) for w in self._known}

    def save(self) -> None:
        """Write the kept estimate (atomically; a read-only cache is skipped): what it held when this
        process started, averaged with what this process measured so far. However often a process saves,
        it moves the estimate half way to its own medians, no further."""
        self._unsaved = 0
        now = self.measured()
        if self.path is None or not now:
            return
        merged = dict(self.stored)
        for w, c in now.items():
            merged[w] = (merged[w] + c) / 2 if w in merged else c
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"costs": merged, "saved": time.strftime("%Y-%m-%d %H:%M:%S")}))
            os.replace(tmp, self.path)
        except OSError:
            return


class MaskSteps:
    """`StepCost.masks`: width -> relative time of a step that feeds masks; `plain` as its step cost's. A
    one-token step feeds no masks: width 1 is the plain step itself (1.0), the price of drafting nothing,
    never the mask steps' record extended down to one token (which priced a plain step like a mask step,
    ~1.36 one-token steps on SmolLM2 float32, so that drafts won even where they lost time)."""

    def __init__(self, cost: StepCost):
        self.cost = cost

    @property
    def plain(self) -> bool:
        return self.cost.plain

    @property
    def rows(self) -> int:
        return getattr(self.cost, "rows", 1)

    def __call__(self, w: int) -> float:
        own = self.cost._with_masks
        if own is None or w <= 1:  # no step with masks measured yet, or none at this width: as the others
            return self.cost(w)
        c = own._memo.get(w)  # cleared whenever either record gains a median (`_sample`)
        if c is None:
            one = self.cost.seconds(1)
            t = own.seconds(w) if one is not None else None
            c = own._memo[w] = self.cost(w) if t is None else max(1.0, t / one)
        return c


@functools.lru_cache(maxsize=1)
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def disk_key(forward: ModelForward, batch: int) -> str:
    """What the costs depend on: the model's shapes (`ModelForward.shape`: config, dtype, device, narrow
    layers, a drafting adapter's rank, attention path, weight format), the threads, the processor and
    torch's version (not the weights), then the batch: `FAMILY-bBATCH`."""
    parts = [*forward.shape, str(torch.get_num_threads()), _cpu_name(), torch.__version__]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24] + f"-b{batch}"


def _disk_file(key: str) -> Path:
    """$SBD_COSTS_CACHE/KEY.json, else the cache folder's step_costs/KEY.json."""
    from ..models.names import cache_dir

    folder = os.environ.get("SBD_COSTS_CACHE")
    return (Path(folder) if folder else cache_dir() / "step_costs") / f"{key}.json"


def _read(path: Path) -> dict[int, float]:
    """The kept estimate ({} when there is none or it is unreadable: the default prior then)."""
    try:
        costs = {int(w): float(c) for w, c in json.loads(path.read_text())["costs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return costs if all(w >= 1 and math.isfinite(c) and c >= 1.0 for w, c in costs.items()) else {}


def _prior(stored: dict[int, float], slope: float) -> Callable[[int], float]:
    """The kept estimate, linear between its widths and extended by `slope` beyond them; the line alone
    without one."""
    if not stored:
        return lambda w: 1.0 + slope * (w - 1)
    points = dict(stored)
    points[1] = 1.0
    widths = sorted(points)

    def prior(w: int) -> float:
        if w >= widths[-1]:
            return points[widths[-1]] + slope * (w - widths[-1])
        i = bisect.bisect_right(widths, w)
        a, b = widths[i - 1], widths[i]
        return points[a] + (points[b] - points[a]) * (w - a) / (b - a)
    return prior


def forward_costs(model, batch: int = 1) -> StepCost:
    """The step cost of `model` at `batch` rows: one object per model and batch in this process (so what
    one call learns the next uses), its prior from disk or the default line. Never times a forward."""
    per_model = _COSTS.setdefault(model, {})
    cost = per_model.get(batch)
    if cost is None:
        forward = ModelForward(model)
        path = _disk_file(disk_key(forward, batch))
        stored = _read(path)
        cost = per_model[batch] = StepCost(_prior(stored, DEFAULT_SLOPE.get(forward.device.type, 0.15)), path, stored)
        cost.rows = batch  # rows decoded in one forward (the draft-length rule reads it)
    return cost
