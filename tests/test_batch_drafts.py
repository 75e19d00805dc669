"""The batch's draft decision (`sbd.decoding.batch_drafts`): drafts priced at their records, dropped least
valuable first while the step's tokens per unit of time grow, none kept when nothing pays."""

from sbd.decoding.batch_drafts import draft_gain, drafts_to_drop
from sbd.decoding.draft_lengths import expected_tokens
from sbd.decoding.draft_policy import DEFAULT_OPTIONS, DraftPolicy

MASK = 99


def _policy(masks_kept: int, lookup_kept: int) -> DraftPolicy:
    p = DraftPolicy(4, DEFAULT_OPTIONS)
    for _ in range(10):
        p.record("masks", masks_kept, masks_kept < 3)
        p.record("lookup", lookup_kept, lookup_kept < 3)
    return p


def test_a_draft_is_priced_at_its_sources_record():
    p = _policy(3, 1)
    t, w, m = draft_gain(p, [5, 6, MASK, MASK, MASK], MASK)  # a chain of 2 and 3 masks: 6 wide at steady state
    assert (w, m) == (5, True) and t == expected_tokens(p.alpha("masks"), 2) - 1.0
    t, w, m = draft_gain(p, [7, 8, 9], MASK)  # lookup: 1 + 3 wide
    assert (w, m) == (3, False) and t == expected_tokens(p.alpha("lookup"), 3) - 1.0


def test_drafts_are_dropped_least_valuable_first_and_all_when_width_is_dear():
    good, poor = _policy(3, 3), _policy(0, 0)
    drafts = [[1, 2, MASK, MASK], [], [3, 4, 5, 6], [7, MASK, MASK]]
    policies = [good, None, poor, good]
    assert drafts_to_drop(drafts, policies, MASK, 4, lambda w, masks: 1.0) == []  # width free: keep all
    steep = drafts_to_drop(drafts, policies, MASK, 4, lambda w, masks: 1.0 + 0.05 * (w - 4))
    assert steep == [2]  # the poor lookup draft goes, the good chains stay
    assert sorted(drafts_to_drop(drafts, policies, MASK, 4, lambda w, masks: 1.0 + 5 * (w - 4))) == [0, 2, 3]


def test_a_rows_probes_back_off_while_refused_and_return_when_kept():
    """While no draft pays, a row probes after 16 plain steps; each refused probe doubles the gap (up to
    16 × 8), a kept one brings it back to 16."""
    p = DraftPolicy(4, DEFAULT_OPTIONS)
    dear = lambda w: 1.0 if w == 1 else 10.0  # noqa: E731 (no draft ever pays)
    p.record("masks", 0, True)

    def steps_to_probe():
        for n in range(1, 1000):
            p.adapt(dear)
            if p.n_masks:
                return n
        raise AssertionError("no probe")

    gaps = []
    for _ in range(5):
        gaps.append(steps_to_probe())
        p.record("masks", 0, False)  # the forward that fed the probe's masks: no draft to verify yet
        p.record("masks", 0, True)  # the probe's draft token refused
    assert gaps == [16, 32, 64, 128, 128]
    steps_to_probe()
    p.record("masks", 1, False)  # kept
    assert steps_to_probe() == 16
    p.adapt(dear, probe=True)  # a probe the caller schedules (the vLLM proposer) comes whatever the gap
    assert p.n_masks == 2
