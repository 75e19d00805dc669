"""The engine behind the server: one thread that owns the model and decodes every admitted request as a
row of one engine (continuous batching), and hands each request its tokens as they become final.

Requests wait in a bounded queue (full: 429) until a row is free; a request whose client left is
taken out between two steps; an exception inside a step fails the requests of that step only and
the engine starts afresh; `stop()` lets the running and waiting requests finish (drain) first, and
`stop(abort=True)` fails them and ends after the step in flight (a second Ctrl-C).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time

import torch

from ..decoding.engine import Engine
from ..modes import eval_mode
from .metrics import Metrics
from .errors import APIError

log = logging.getLogger("sbd.serve")


class Job:
    """One row of a request inside the worker, and the asyncio queue its handler reads events from:
    (index, "tokens", [ids…]) as tokens become final, then (index, "done", None) or (index, "error",
    message). The n rows of one request share a queue; `index` tells them apart."""

    def __init__(self, row, method: str, loop: asyncio.AbstractEventLoop, events: asyncio.Queue | None = None,
                 index: int = 0):
        self.row, self.method, self.loop, self.index = row, method, loop, index
        self.events: asyncio.Queue = events if events is not None else asyncio.Queue()
        self.cancelled = False
        self.arrived = time.perf_counter()
        self.first_token: float | None = None
        self.sent = 0

    def post(self, kind: str, payload=None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, kind, payload))
        except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
            pass


class Worker:
    def __init__(self, model, *, slots: int, capacity: int, max_width: int, max_queue: int,
                 metrics: Metrics | None = None, prefill: str = "separate", step_cost=None):
        self.model = model
        self.step_cost = step_cost  # the engine tells it every step's time (`sbd.decoding.width_cost`)
        self.slots, self.capacity, self.max_width, self.prefill = slots, capacity, max_width, prefill
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self.pending: collections.deque[Job] = collections.deque()
        self.jobs: dict[int, Job] = {}  # id(row) → job, for the rows in the engine
        self.cond = threading.Condition()
        self.stopping = False
        self.aborting = False
        self.engine = self._new_engine()
        self.thread = threading.Thread(target=self._run, name="sbd-engine", daemon=True)
        self._window = [time.perf_counter(), 0]

    def _new_engine(self) -> Engine:
        return Engine(self.model, self.slots, self.capacity, max_width=self.max_width, prefill=self.prefill,
                      step_cost=self.step_cost)

    def start(self) -> None:
        self.thread.start()

    def submit(self, *jobs: Job) -> None:
        """Queue a request's rows, all or none; 429 when the queue has no room for them, 503 while the
        server drains."""
        for job in jobs:
            if job.row.needs > self.capacity:
                raise APIError(400, f"prompt ({len(job.row.prompt)} tokens) and max_tokens need {job.row.needs} "
                                    f"positions; this server holds {self.capacity} per request",
                               code="context_length_exceeded")
        if len(jobs) > self.max_queue:  # never fits, however idle the server: retrying cannot help
            raise APIError(400, f"n = {len(jobs)} choices need {len(jobs)} queue places; this server queues at most "
                                f"{self.max_queue} rows", param="n")
        with self.cond:
            if self.stopping:
                raise APIError(503, "the server is shutting down", type_="server_error")
            if len(self.pending) + len(jobs) > self.max_queue:
                raise APIError(429, f"the queue is full ({self.max_queue} rows waiting); retry later",
                               type_="rate_limit_error")
            self.pending.extend(jobs)
            self.metrics.queue.set(len(self.pending))
            self.cond.notify()

    def cancel(self, job: Job) -> None:
        """The client left: its row is freed before the next step."""
        job.cancelled = True
        with self.cond:
            self.cond.notify()

    def stop(self, timeout: float | None = None, abort: bool = False) -> None:
        """Finish what is running and waiting, then end the thread; `abort`: fail them instead, after the
        step in flight."""
        with self.cond:
            self.stopping = True
            self.aborting = self.aborting or abort
            self.cond.notify()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    # -- the thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        with eval_mode(self.model), torch.inference_mode():
            while True:
                with self.cond:
                    while not self.pending and not self.engine.live and not self.stopping:
                        self.cond.wait()
                    if self.aborting:
                        self._fail_all("the server is shutting down")
                        return
                    if self.stopping and not self.pending and not self.engine.live:
                        return
                    self._admit()
                self._drop_cancelled()
                if self.engine.live:
                    self._step()

    def _admit(self) -> None:
        while self.pending and self.engine.live < self.slots:
            job = self.pending.popleft()
            if job.cancelled:
                continue
            self.engine.add(job.row)
            self.jobs[id(job.row)] = job
        self.metrics.queue.set(len(self.pending))
        self.metrics.running.set(self.engine.live)

    def _fail_all(self, message: str) -> None:
        for job in [*self.pending, *self.jobs.values()]:
            job.post("error", message)
        self.pending.clear()
        self.jobs.clear()

    def _drop_cancelled(self) -> None:
        for job in [j for j in self.jobs.values() if j.cancelled]:
            self.engine.remove(job.row)
            del self.jobs[id(job.row)]
        self.metrics.running.set(self.engine.live)

    def _step(self) -> None:
        live = list(self.jobs.values())
        try:
            done = self.engine.step()
        except Exception as e:  # one bad step must not take the server down
            log.exception("decoding step failed; failing its %d requests", len(live))
            for job in live:
                job.post("error", f"decoding failed: {e}")
            self.jobs.clear()
            self.engine = self._new_engine()
            return
        self.metrics.steps.inc()
        now = time.perf_counter()
        made = 0
        for job in live:
            tokens = job.row.final_tokens()
            if len(tokens) > job.sent:
                if job.first_token is None:
                    job.first_token = now
                    self.metrics.ttft.observe(now - job.arrived)
                made += len(tokens) - job.sent
                job.post("tokens", list(tokens[job.sent:]))
                job.sent = len(tokens)
        for row in done:
            job = self.jobs.pop(id(row))
            self.metrics.latency.observe(now - job.arrived)
            self.metrics.finished(job.method, len(row.out), row.nfe, row.proposed, sum(row.accepted))
            job.post("done")
        self.metrics.running.set(self.engine.live)
        start, count = self._window
        count += made
        if now - start >= 1.0:
            self.metrics.tokens_per_second.set(count / (now - start))
            start, count = now, 0
        self._window = [start, count]
