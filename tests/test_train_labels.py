"""Labels and loss of the SBD recipe against a deliberately naive reference (Python loops)."""

from __future__ import annotations

import math

import pytest
import torch

from sbd.errors import SBDError
from sbd.training.collator import SBDDataCollator
from sbd.training.loss import sbd_loss

MASK_ID, PAD_ID = 2, 1


class _Tok:
    mask_token_id, pad_token_id, eos_token_id = MASK_ID, PAD_ID, 0


EOS_ID = _Tok.eos_token_id


def naive_labels(seqs, prompts, noisy, k, length, aligned=False, last_block="eos"):
    """SPEC §2 written out: one loop per half, one `if` per rule. With last_block="eos" a sequence ending
    in EOS continues with EOS up to the end of its block, and those positions are targets too."""
    rows = []
    for seq, p, x_hat in zip(seqs, prompts, noisy):
        n = len(seq)
        clean = []
        for i in range(length):
            has_next = i + 1 < n
            clean.append(seq[i + 1] if has_next and i + 1 >= p else -100)
        origin = p if aligned else 0
        span = n - origin
        padded = span
        if last_block == "eos" and seq[-1] == EOS_ID:
            while padded % k:
                padded += 1
        complete_end = (padded // k) * k
        matp = []
        for j in range(len(x_hat)):
            pos = origin + j
            if j < padded and x_hat[j] == MASK_ID and j < complete_end and pos >= p:
                matp.append(seq[pos] if j < span else EOS_ID)
            else:
                matp.append(-100)
        rows.append(clean + matp)
    return torch.tensor(rows)


def naive_loss(logits, labels, num_clean):
    total, ntp, matp, n_ntp, n_matp = 0.0, 0.0, 0.0, 0, 0
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            y = int(labels[b, t])
            if y == -100:
                continue
            row = logits[b, t].double()
            nll = -(row[y] - math.log(sum(math.exp(v) for v in row.tolist())))
            total += nll
            if t < num_clean:
                ntp, n_ntp = ntp + nll, n_ntp + 1
            else:
                matp, n_matp = matp + nll, n_matp + 1
    return total / (n_ntp + n_matp), ntp / max(n_ntp, 1), matp / max(n_matp, 1), n_ntp, n_matp


@pytest.mark.parametrize("aligned", [False, True], ids=["paper", "aligned"])
@pytest.mark.parametrize("last_block", ["eos", "drop"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_labels_and_loss_match_naive_reference(seed, aligned, last_block):
    g = torch.Generator().manual_seed(seed)
    lengths = [int(x) for x in torch.randint(2, 40, (5,), generator=g)]
    prompts = [int(torch.randint(0, n - 1, (1,), generator=g)) if i % 2 else 0 for i, n in enumerate(lengths)]
    seqs = [torch.randint(3, 50, (n,), generator=g).tolist() for n in lengths]
    for s in seqs[::2]:
        s[-1] = EOS_ID  # rows 0, 2, 4 end with EOS; the others look truncated
    collator = SBDDataCollator(_Tok(), align_to_completion=aligned, last_block=last_block)
    clean = collator.pad([{"input_ids": s, "prompt_length": p} for s, p in zip(seqs, prompts)])
    num_clean = max(lengths)
    for k in (2, 3, 5, 16):
        eta, u = collator.draw_noise(5, collator.noisy_length(clean), g)  # eta ~ U(0,1) per sequence
        batch = collator.corrupt(clean, k, eta, u)
        t = batch["input_ids"].shape[1]
        assert batch["num_clean"] == num_clean
        assert batch["labels"].shape == (5, t) and batch["attention_mask"].shape == (5, 1, t, t)
        noisy = batch["input_ids"][:, num_clean:].tolist()
        expected = naive_labels(seqs, prompts, noisy, k, num_clean, aligned, last_block)
        assert torch.equal(batch["labels"], expected), f"labels differ from the naive reference (k={k})"
        # the noisy copy is the clean one with some positions replaced by the mask token, nothing else
        for b, (s, p) in enumerate(zip(seqs, prompts)):
            origin = p if aligned else 0
            for j, tok in enumerate(noisy[b][: len(s) - origin]):
                assert tok in (MASK_ID, s[origin + j])
            padded = len(s) - origin
            if last_block == "eos" and s[-1] == EOS_ID:
                padded = -(-padded // k) * k
            assert all(tok in (MASK_ID, EOS_ID) for tok in noisy[b][len(s) - origin: padded])
            assert all(tok == PAD_ID for tok in noisy[b][padded:])
            pos = batch["position_ids"][b, num_clean: num_clean + padded]
            assert pos.tolist() == list(range(origin, origin + padded))
        logits = torch.randn(5, t, 23, generator=g) * 3
        labels = batch["labels"] % 23  # keep targets inside the small random vocabulary
        labels[batch["labels"] == -100] = -100
        parts = sbd_loss(logits, labels, num_clean)
        ref, ref_ntp, ref_matp, n_ntp, n_matp = naive_loss(logits, labels, num_clean)
        assert n_ntp > 0
        assert parts.loss.item() == pytest.approx(float(ref), rel=1e-5)
        assert (parts.ntp_sum / parts.ntp_count).item() == pytest.approx(float(ref_ntp), rel=1e-5)
        if n_matp:
            assert (parts.matp_sum / parts.matp_count).item() == pytest.approx(float(ref_matp), rel=1e-5)
        assert (int(parts.ntp_count), int(parts.matp_count)) == (n_ntp, n_matp)


def test_random_block_size_and_rate_per_call():
    """Unfixed, __call__ draws k from {2..16} and eta per sequence; a seed makes it reproducible."""
    feats = [{"input_ids": list(range(3, 43))} for _ in range(8)]
    collator = SBDDataCollator(_Tok(), seed=0)
    ks, rates = set(), []
    for _ in range(60):
        batch = collator(feats)
        ks.add(int(batch["attention_mask"][0, 0, 40, 40:].sum()))  # first noisy query sees its block
        rates += (batch["input_ids"][:, 40:] == MASK_ID).float().mean(1).tolist()
    assert ks == set(range(2, 17))
    assert min(rates) < 0.15 and max(rates) > 0.85
    again = SBDDataCollator(_Tok(), seed=0)(feats)
    assert torch.equal(again["input_ids"], SBDDataCollator(_Tok(), seed=0)(feats)["input_ids"])


def test_fixed_block_size_and_rate():
    seqs = [list(range(3, 3 + 20))]
    batch = SBDDataCollator(_Tok(), block_size=6, mask_rate=1.0)([{"input_ids": s} for s in seqs])
    noisy = batch["input_ids"][0, 20:]
    assert (noisy == MASK_ID).all()
    expected = naive_labels(seqs, [0], [noisy.tolist()], 6, 20)
    assert torch.equal(batch["labels"], expected)
    assert int((batch["labels"][0, 20:] != -100).sum()) == 18  # three complete blocks of 6, all masked
    assert int((batch["labels"][0, :20] != -100).sum()) == 19


def test_eos_padding_completes_the_last_block():
    """A 10-token sequence ending in EOS, k=4: the noisy copy runs to 12, with EOS targets at 9 (the real
    EOS), 10 and 11; under the paper's rule (drop) only the two complete blocks carry MATP targets."""
    seq = list(range(3, 12)) + [EOS_ID]
    batch = SBDDataCollator(_Tok(), block_size=4, mask_rate=1.0)([{"input_ids": seq}])
    assert batch["input_ids"].shape[1] == 10 + 12
    assert batch["labels"][0, 10:].tolist() == list(range(3, 12)) + [EOS_ID] * 3
    dropped = SBDDataCollator(_Tok(), block_size=4, mask_rate=1.0, last_block="drop")([{"input_ids": seq}])
    assert dropped["labels"][0, 10:].tolist() == list(range(3, 11)) + [-100] * 2
    truncated = SBDDataCollator(_Tok(), block_size=4, mask_rate=1.0)([{"input_ids": seq[:-1] + [40]}])
    assert truncated["labels"][0, 10:].tolist() == list(range(3, 11)) + [-100] * 2  # no EOS: nothing padded


def test_suffix_masked_blocks():
    """suffix_share=1: every block shows a prefix of its tokens and masks the rest (at least one mask)."""
    collator = SBDDataCollator(_Tok(), block_size=5, seed=0, suffix_share=1.0)
    cuts = set()
    for _ in range(30):
        noisy = collator([{"input_ids": list(range(3, 23))}])["input_ids"][0, 20:].tolist()
        for start in range(0, 20, 5):
            masked = [t == MASK_ID for t in noisy[start:start + 5]]
            cut = masked.index(True)
            assert masked == [False] * cut + [True] * (5 - cut)
            cuts.add(cut)
    assert cuts == set(range(5))


def test_prompt_tokens_carry_no_loss():
    seq, p = list(range(3, 3 + 12)), 5
    batch = SBDDataCollator(_Tok(), block_size=4, mask_rate=1.0)([{"input_ids": seq, "prompt_length": p}])
    labels = batch["labels"][0]
    clean_targets = [i for i in range(12) if labels[i] != -100]
    assert clean_targets == list(range(p - 1, 11))  # position p-1 predicts the first completion token
    noisy_targets = [i for i in range(12) if labels[12 + i] != -100]
    assert noisy_targets == list(range(p, 12))


def test_pooled_mean_over_micro_batches():
    """Passing the step's target count makes micro-batch losses add up to the pooled mean."""
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(4, 10, 7, generator=g), torch.randint(0, 7, (4, 10), generator=g)
    labels[torch.rand(4, 10, generator=g) < 0.4] = -100
    whole = sbd_loss(logits, labels, 5).loss
    n = (labels != -100).sum()
    halves = sbd_loss(logits[:1], labels[:1], 5, n).loss + sbd_loss(logits[1:], labels[1:], 5, n).loss
    assert halves.item() == pytest.approx(whole.item(), rel=1e-6)


@pytest.mark.parametrize("features, message", [
    ([], "empty"),
    ([{"text": "x"}], "input_ids"),
    ([{"input_ids": [5]}], "at least 2"),
    ([{"input_ids": [5, 6, 7], "prompt_length": 3}], "prompt_length"),
    ([{"input_ids": [5, MASK_ID, 7]}], "mask token"),
])
def test_collator_rejects_bad_examples(features, message):
    with pytest.raises(SBDError, match=message):
        SBDDataCollator(_Tok())(features)


def test_collator_needs_a_mask_token():
    with pytest.raises(SBDError, match="mask token"):
        SBDDataCollator(None)
    with pytest.raises(SBDError, match="block_size_range"):
        SBDDataCollator(_Tok(), block_size_range=(5, 3))
    with pytest.raises(SBDError, match="EOS"):
        SBDDataCollator(mask_token_id=MASK_ID)  # EOS padding needs to know EOS
    with pytest.raises(SBDError, match="last_block"):
        SBDDataCollator(_Tok(), last_block="pad")
    with pytest.raises(SBDError, match="suffix_share"):
        SBDDataCollator(_Tok(), suffix_share=1.5)
