"""The only place that reads vLLM's model runner.

vLLM 0.32 gives a `custom_class` proposer no handle on its runner: the class is built with the `VllmConfig`
alone (`create_custom_proposer`), `load_model` gets the model alone, and `propose` gets `sampled_token_ids`,
the batch's `num_tokens_no_spec` and `token_ids_cpu` arrays and `slot_mappings`, never the request ids, the
drafts scheduled or `query_start_loc` (the built-in proposers that need them, EAGLE and the GPU n-gram one,
are handed the runner itself). The forward context holds neither. So the runner is found once, as the frame
that called `load_model` with the proposer as its `drafter`, and every private field sbd reads of it is read
here (`RunnerView`). The day vLLM hands a proposer its runner, this file goes.
"""

from __future__ import annotations

import sys


def find_runner(proposer, depth: int = 8):
    """The model runner that owns `proposer`: the caller of its `load_model` (called from there)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if getattr(owner, "drafter", None) is proposer and hasattr(owner, "input_batch"):
            return owner
        frame = frame.f_back
    raise RuntimeError("SBDProposer.load_model was not called by a vLLM model runner that holds it as its drafter")


class RunnerView:
    """What sbd reads of vLLM's runner for one step: the batch's request ids and scheduled drafts, the
    step's total width, and (for the model) the forward's layout."""

    def __init__(self, runner):
        self.runner = runner

    def req_ids(self, n: int | None = None) -> list:
        ids = self.runner.input_batch.req_ids
        return ids if n is None else ids[:n]

    def spec_token_ids(self) -> list:
        """The draft tokens scheduled for each request in the step just run."""
        return self.runner.input_batch.spec_token_ids

    def total_width(self, n: int) -> int:
        """Tokens the step just run fed for its first `n` requests."""
        return int(self.runner.query_start_loc.np[n])

    def batch_view(self):
        """(request ids, scheduled drafts, query start offsets, the forward's host input ids or None): what
        the model's gate needs to find each request's masks (`SBDModelMixin.sbd_bind`)."""
        batch = self.runner.input_batch
        n = batch.num_reqs
        qsl = self.runner.query_start_loc.np[: n + 1]
        ids = getattr(self.runner.input_ids, "cpu", None)  # vLLM's host copy of the forward's input ids
        return batch.req_ids[:n], batch.spec_token_ids[:n], qsl, None if ids is None else ids[: int(qsl[-1])]
