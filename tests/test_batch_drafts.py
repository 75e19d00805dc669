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
