"""What a wider step costs (`sbd.decoding.width_cost`): learnt from the engine's own steps, never timed
before a call; medians that a stall does not move; a prior from the estimate kept on disk (averaged over
runs, unreadable files ignored) or a default line."""

import pytest

import sbd
from sbd.decoding import width_cost
from sbd.decoding.forward import ModelForward
from sbd.decoding.width_cost import StepCost


def _line(slope):
    return lambda w: 1.0 + slope * (w - 1)


def test_medians_of_the_steps_price_widths_and_a_stall_moves_nothing():
    cost = StepCost(_line(0.5))
    assert cost(5) == 3.0  # nothing measured: the prior
    for _ in range(5):
        cost.add(1, 0.010)
        cost.add(4, 0.020)
    cost.add(4, 1.0)  # the machine stalled once
    assert cost(1) == 1.0 and cost(4) == pytest.approx(2.0)
    assert cost(2) == pytest.approx(4 / 3)  # linear between measured widths
    assert cost(8) == pytest.approx(2.0 * (1 + 0.5 * 7) / (1 + 0.5 * 3))  # beyond: the prior's shape from 4
    cost.add(0, 1.0), cost.add(3, float("nan")), cost.add(3, -1.0)  # nonsense is ignored
    assert 3 not in cost.measured() and cost.measured() == {1: 1.0, 4: pytest.approx(2.0)}


def test_steps_that_feed_masks_are_priced_apart_from_those_that_do_not():
    """A lookup draft (no masks) and a mask draft of one width differ in cost where the drafting adapter
    is dear (quantized weights on a CPU): `masks` prices the second from its own steps."""
    cost = StepCost(_line(0.1))
    for _ in range(3):
        cost.add(1, 0.010)
        cost.add(3, 0.012)
    assert cost.masks(3) == cost(3) == pytest.approx(1.2)  # no step with masks yet: priced as the others
    for _ in range(3):
        cost.add(3, 0.019, masks=True)
    assert cost(3) == pytest.approx(1.2) and cost.masks(3) == pytest.approx(1.9)
    assert cost.masks(4) == pytest.approx(1.9 * 1.3 / 1.2)  # beyond its widths: the prior's shape
    assert cost.masks.plain == cost.plain
    assert cost.masks(2) == pytest.approx(1.9 * 1.1 / 1.2)  # below its widths: the prior's shape too
    assert cost.masks(1) == cost(1) == 1.0  # a one-token step feeds no masks: the plain step, never extended


def test_drafting_nothing_is_priced_as_a_plain_step_where_mask_steps_are_dear():
    """Mask steps at ~2 one-token steps and drafts that stand half the time: no draft pays, so the policy
    feeds plain steps. (Pricing the plain step from the mask steps' record, 1.5 here, made every draft look
    cheaper than drafting nothing: SmolLM2 float32 sbd-verify ran at 0.77x NTP on a Xeon.)"""
    from sbd.decoding.draft_lengths import best_draft_length

    cost = StepCost(_line(0.1))
    for _ in range(3):
        cost.add(1, 0.010)
        for w in (5, 8):
            cost.add(w, 0.010 * (1.5 + 0.07 * w), masks=True)
    assert cost.masks(1) == 1.0 and cost.masks(5) == pytest.approx(1.85)
    assert best_draft_length(0.5, cost.masks, 7) == 0
    assert best_draft_length(0.9, cost.masks, 7) > 0  # drafts that stand pay for the same steps


def test_a_width_never_measured_alone_is_anchored_by_the_prior():
    cost = StepCost(_line(0.1))
    for _ in range(3):
        cost.add(6, 0.03)
        cost.add(11, 0.045)
    assert cost(6) == pytest.approx(1.5)  # the one-token step from the prior's ratio at the narrowest width
    assert cost(11) == pytest.approx(1.5 * 0.045 / 0.03)


def test_a_call_times_no_forward_and_its_steps_teach_the_cost(llama, monkeypatch, tmp_path):
    """The first adaptive call runs only its own forwards (no table timed before it), and every decoding
    step it runs reaches the step cost with its width."""
    monkeypatch.setenv("SBD_COSTS_CACHE", str(tmp_path))
    monkeypatch.setattr(width_cost, "_COSTS", __import__("weakref").WeakKeyDictionary())
    calls, adds = [], []
    real_call, real_add = ModelForward.__call__, StepCost.add
    monkeypatch.setattr(ModelForward, "__call__", lambda self, step, *a, **k: calls.append(
        step.tokens.shape[1]) or real_call(self, step, *a, **k))
    monkeypatch.setattr(StepCost, "add", lambda self, w, s, masks=False: adds.append(w) or real_add(self, w, s, masks))
    r = sbd.generate(llama, None, [[5, 6, 7, 8, 9] * 4], method="sbd-verify", draft="adaptive", block_size=4,
                     max_new_tokens=64, eos_token_ids=[])
    assert len(calls) == 1 + r.nfe[0]  # the prefill and the decoding forwards: nothing else ran
    assert adds == calls[1:]  # every decoding step, with its width; the prefill is not a decoding step
    assert len(adds) > 18 and 1 in adds[:18] and max(adds) > 1  # drafts, and the one-token step asked for
    assert list(tmp_path.glob("*.json"))  # what the call learnt is kept


def test_the_cost_asks_for_one_token_steps_now_and_then():
    """Widths are priced against the one-token step, which adaptive drafts may never run by themselves."""
    cost = StepCost(_line(0.1))
    asks = []
    for _ in range(40):
        cost.add(5, 0.01)
        asks.append(cost.plain)
    gap, ask = width_cost.PLAIN_GAP[0], width_cost.PLAIN_ASK
    assert [i + 1 for i, a in enumerate(asks) if a] == [n for n in range(1, 41) if n % gap >= gap - ask]
    for _ in range(3):
        cost.add(1, 0.005)
        assert not cost.plain
    for _ in range(gap):
        cost.add(5, 0.01)
    assert not cost.plain  # with a median for one token, the asks are rarer (PLAIN_GAP[1])


def test_the_kept_estimate_is_the_next_process_prior_averaged_over_runs(llama, monkeypatch, tmp_path):
    monkeypatch.setenv("SBD_COSTS_CACHE", str(tmp_path))
    fresh = lambda: monkeypatch.setattr(width_cost, "_COSTS", __import__("weakref").WeakKeyDictionary())  # noqa: E731
    fresh()
    cost = width_cost.forward_costs(llama, batch=3)
    assert width_cost.forward_costs(llama, batch=3) is cost  # one per model and batch in a process
    assert cost(4) == pytest.approx(1 + width_cost.DEFAULT_SLOPE[llama.device.type] * 3)  # nothing kept: the default line
    for _ in range(3):
        cost.add(1, 0.01), cost.add(4, 0.03)
    cost.save()
    fresh()  # a new process
    again = width_cost.forward_costs(llama, batch=3)
    assert again is not cost and again(4) == pytest.approx(3.0) and again(2) == pytest.approx(5 / 3)
    for _ in range(3):
        again.add(1, 0.01), again.add(4, 0.02)
    again.save()
    again.save()  # a process that saves again moves the estimate no further
    fresh()
    assert width_cost.forward_costs(llama, batch=3)(4) == pytest.approx(2.5)  # half way to the new run
    path = next(tmp_path.glob("*-b3.json"))
    path.write_text("{torn")
    fresh()
    assert width_cost.forward_costs(llama, batch=3)(4) == pytest.approx(1 + width_cost.DEFAULT_SLOPE[llama.device.type] * 3)
