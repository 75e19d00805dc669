"""What the server counts, in Prometheus' format (`GET /metrics`); one registry per server."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("sbd_requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.queue = Gauge("sbd_queue_length", "Requests waiting for a row of the engine", registry=r)
        self.running = Gauge("sbd_running_rows", "Rows being decoded", registry=r)
        self.tokens = Counter("sbd_generated_tokens", "Tokens generated", ["method"], registry=r)
        self.forwards = Counter("sbd_row_forwards", "Forwards spent per row (NFE), summed over rows", ["method"],
                                registry=r)
        self.steps = Counter("sbd_engine_steps", "Batched model calls of the engine", registry=r)
        self.proposed = Counter("sbd_draft_tokens_proposed", "sbd-verify: draft tokens put up for verification",
                                registry=r)
        self.accepted = Counter("sbd_draft_tokens_accepted", "sbd-verify: draft tokens accepted", registry=r)
        self.tokens_per_forward = Gauge("sbd_tokens_per_forward", "Tokens per forward over finished requests",
                                        ["method"], registry=r)
        self.tokens_per_second = Gauge("sbd_tokens_per_second", "Tokens generated per second by the engine, "
                                       "over the last busy second or more", registry=r)
        self.ttft = Histogram("sbd_time_to_first_token_seconds", "Arrival to first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("sbd_request_seconds", "Arrival to last token", buckets=LATENCY_BUCKETS,
                                 registry=r)
        self._done: dict[str, list[int]] = {}

    def finished(self, method: str, tokens: int, nfe: int, proposed: int, accepted: int) -> None:
        self.tokens.labels(method).inc(tokens)
        self.forwards.labels(method).inc(nfe)
        self.proposed.inc(proposed)
        self.accepted.inc(accepted)
        t, f = self._done.setdefault(method, [0, 0])
        self._done[method] = [t + tokens, f + nfe]
        if f + nfe:
            self.tokens_per_forward.labels(method).set((t + tokens) / (f + nfe))

    def text(self) -> bytes:
        return generate_latest(self.registry)
