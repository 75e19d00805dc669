"""Prompt-lookup drafts inside sbd-verify (`lookup=True`): when the last 3 (else 2) tokens occurred
earlier, the draft is what followed them there, and the model's own next-token head still decides.

Exactness: greedy output equals the original model's Hugging Face greedy output with a drafting adapter
attached, on every architecture, alone and in a batch (tokens and forwards), with block and adaptive
drafts. Cost: on a scripted model whose masks are always wrong but whose output repeats, the accepted
drafts all come from lookup and the forwards drop well below NTP's.
"""

from collections import Counter

import pytest
import torch
from conftest import attach_random_adapter, hf_greedy, random_prompts
from test_verify import TwoHeadLM

import sbd
from sbd.drafters import adapter as adapters
from sbd.decoding.rows import VerifyRow
from sbd.decoding.spec import DecodeSpec


def _row(seq, lookup_max=3):
    row = VerifyRow(DecodeSpec(block_size=4, lookup=True, lookup_max=lookup_max, max_new_tokens=10), seq, mask_id=31)
    return row.lookup_index.find(row.out, row.lookup_max)


def test_lookup_takes_the_latest_match_of_the_longest_ngram():
    assert _row([7, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 9, 9, 1, 2, 3]) == [9, 9, 1]  # latest of two, capped
    assert _row([7, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 9, 9, 1, 2, 3], lookup_max=7) == [9, 9, 1, 2, 3, 9, 9]  # repeats
    assert _row([5, 2, 3, 4, 6, 7, 8, 1, 2, 3]) == [4, 6, 7]  # no earlier [1, 2, 3]: the 2-gram [2, 3]
    assert _row([3, 4, 2, 3, 9, 1, 2, 3]) == [9, 1, 2]  # the 2-gram's latest match
    assert _row([1, 2, 3, 7, 5, 2, 3, 8, 1, 2, 3]) == [7, 5, 2]  # a 3-gram match wins over a later 2-gram one
    assert _row([1, 2, 3, 4]) == []  # nothing repeats
    assert _row([1, 1, 1, 1]) == [1, 1, 1]  # an overlapping match: the loop goes on


def _cycle(p):
    return 3 + p % 5  # the next-token head repeats a 5-token cycle, never EOS or the mask


def test_repeating_output_is_drafted_by_lookup_when_the_masks_are_wrong():
    model = TwoHeadLM(_cycle, lambda p: 20)  # the masks always draft token 20, which never comes
    kw = dict(method="sbd-verify", block_size=8, max_new_tokens=40, eos_token_ids=[])
    plain = sbd.generate(model, None, [[5, 6, 7]], **kw)
    looked = sbd.generate(model, None, [[5, 6, 7]], lookup=True, **kw)
    expected = [_cycle(p) for p in range(3, 43)]
    assert plain.token_ids[0] == looked.token_ids[0] == expected
    assert plain.nfe == [40] and plain.lookup_accepted == [0]
    # Output 6 7 3 4 5 6 7 3 …: forwards 1-5 find no match or a wrong one ([6, 7] → 6 7 6 7 …); forward 6
    # drafts from [5, 6] in the prompt (7 6 7 3 …: the 7 stands); from forward 8 on, [6, 7, 3] has been
    # seen and lookup drafts the cycle, 16 tokens (lookup_max, twice the block) + 1, then the last 14 + 1.
    assert looked.accepted[0] == [0, 0, 0, 0, 0, 0, 1, 16, 14] and looked.nfe == [9]
    assert max(Counter(looked.steps[0]).values()) == 17 > 8
    assert looked.lookup_accepted[0] == sum(looked.accepted[0]) > 25
    capped = sbd.generate(model, None, [[5, 6, 7]], lookup=True, lookup_max=7, **kw)  # the old cap: block − 1
    assert capped.token_ids == looked.token_ids and capped.nfe == [11]
    assert capped.accepted[0] == [0, 0, 0, 0, 0, 0, 1, 7, 7, 7, 7]  # a whole block (7 drafted + 1) per forward


def test_a_wrong_lookup_draft_keeps_its_prefix_and_costs_no_extra_forward():
    # the output repeats but changes at one point: lookup's draft is refused there, NTP's token stands
    ntp = lambda p: 17 if p == 20 else _cycle(p)  # noqa: E731
    model = TwoHeadLM(ntp, lambda p: 20)
    out = sbd.generate(model, None, [[5, 6, 7]], method="sbd-verify", block_size=4, max_new_tokens=40,
                       eos_token_ids=[], lookup=True)
    assert out.token_ids[0] == [ntp(p) for p in range(3, 43)]
    assert out.nfe[0] < 40 and 0 < out.lookup_accepted[0] == sum(out.accepted[0])


@pytest.mark.parametrize("draft", ["block", "adaptive"])
def test_lookup_gives_the_original_models_greedy_tokens_alone_and_batched(model, draft, cheap_width):
    base = random_prompts(4, model.config.vocab_size, seed=5)
    prompts = [p + p for p in base]  # each prompt repeats itself, so lookup finds matches from the start
    n = 24
    ref = [hf_greedy(model, p, n) for p in prompts]
    attach_random_adapter(model, seed=2)
    try:
        kw = dict(method="sbd-verify", block_size=4, max_new_tokens=n, draft=draft, lookup=True)
        batch = sbd.generate(model, None, prompts, **kw)
        assert batch.token_ids == ref
        for i, p in enumerate(prompts):
            alone = sbd.generate(model, None, [p], **kw)
            assert alone.token_ids[0] == ref[i] and alone.nfe[0] == batch.nfe[i]
            assert alone.lookup_accepted[0] == batch.lookup_accepted[i]
        assert sum(batch.lookup_accepted) > 0  # lookup drafts were proposed and some stood
    finally:
        adapters.detach(model)


def test_lookup_misuse_is_refused_in_one_line(llama):
    p = [[5, 6, 7]]
    for kw in (dict(method="sbd"), dict(method="ntp"), dict(method="sbd-verify", temperature=0.7, seed=1),
               dict(method="sbd-verify", draft="eb")):
        with pytest.raises(sbd.SBDError, match="lookup=True applies to method='sbd-verify'"):
            sbd.generate(llama, None, p, lookup=True, **kw)
    with pytest.raises(sbd.SBDError, match="lookup is true or false"):
        sbd.generate(llama, None, p, method="sbd-verify", lookup="yes")


def test_command_line_lookup(tmp_path, capsys):
    from sbd.cli.main import main

    torch.manual_seed(0)
    assert main(["init", "--out", str(tmp_path / "m"), "--arch", "llama"]) == 0
    assert main(["generate", "--model", str(tmp_path / "m"), "--method", "sbd-verify", "--lookup",
                 "--max-new-tokens", "8", "one two one two one"]) == 0
    err = capsys.readouterr().err  # the statistics table: on stderr
    assert "SBD-VERIFY" in err and "of them from lookup" in err
    assert main(["generate", "--model", str(tmp_path / "m"), "--method", "sbd", "--lookup", "x"]) == 2
    assert "--lookup applies to --method sbd-verify" in capsys.readouterr().err
