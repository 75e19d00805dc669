"""Has SBD fine-tuning converged? Teacher-forced masked prediction against next-token prediction.

SBD decoding can only be as accurate as the model's masked predictions. This check measures them
directly, without decoding, on held-out sequences, with blocks placed where decoding puts them (from
the first completion token on, every `block_size` tokens):

- **left context**: the token at block position j is predicted with every earlier block position
  holding its true token and every later one a mask — exactly the information NTP has for that
  token. If the model has learnt MATP, this top-1 accuracy equals NTP's on the same tokens.
- **fully masked**: every block position is a mask (the first forward of every decoded block).
- **NTP**: the ordinary causal prediction of the same token.

Each is reported by block position and for interior blocks vs the final block (the one holding EOS),
with a calibration table of the masked predictions' entropy (what the EB sampler relies on). The
headline is the gap `masked (left context) − NTP` in points: near 0 means converged. One causal
forward per sequence gives the NTP predictions and the K/V of every prefix; one more forward, one row
per scored token, gives all masked predictions (rows reuse the cached prefix, rows see only their
own block's prefix through the attention mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafters.adapter import gated
from ..decoding.cache import select_rows, slab_cache
from ..errors import SBDError
from ..masks import causal_mask
from ..models.cache_arg import with_cache
from ..modes import eval_mode
from ..sampler import error_proxy

REGIONS = ("interior", "final")
ENTROPY_BINS = (0.0, 0.01, 0.1, 0.35, 1.0, 2.0, float("inf"))


@dataclass
class ConvergenceReport:
    """Counts behind every figure; `headline`, `by_position` and `calibration` turn them into rates.

    counts[r][j] = [tokens, NTP correct, left-context correct, fully-masked correct] for region r
    (0 interior, 1 final) and block position j. bins[i] = [tokens, correct] of the left-context
    masked predictions whose entropy lies in [ENTROPY_BINS[i], ENTROPY_BINS[i+1]).
    """

    block_size: int
    sequences: int = 0
    counts: list = field(default_factory=list)
    bins: list = field(default_factory=list)

    def __post_init__(self):
        if not self.counts:
            self.counts = [[[0, 0, 0, 0] for _ in range(self.block_size)] for _ in REGIONS]
        if not self.bins:
            self.bins = [[0, 0] for _ in range(len(ENTROPY_BINS) - 1)]

    def _totals(self, regions=(0, 1)) -> list[int]:
        return [sum(self.counts[r][j][i] for r in regions for j in range(self.block_size)) for i in range(4)]

    @staticmethod
    def _rates(total: list[int]) -> dict:
        n = max(total[0], 1)
        return {"tokens": total[0], "ntp_acc": 100 * total[1] / n, "masked_acc": 100 * total[2] / n,
                "full_mask_acc": 100 * total[3] / n}

    def headline(self) -> dict:
        """Top-1 accuracies in % over every scored token, and the gap masked − NTP in points."""
        out = self._rates(self._totals())
        out["gap"] = out["masked_acc"] - out["ntp_acc"]
        for r, name in enumerate(REGIONS):
            rates = self._rates(self._totals((r,)))
            out[f"{name}_ntp_acc"], out[f"{name}_masked_acc"] = rates["ntp_acc"], rates["masked_acc"]
        return out

    def by_position(self) -> list[dict]:
        """One row per (region, block position) with at least one scored token."""
        rows = []
        for r, name in enumerate(REGIONS):
            for j in range(self.block_size):
                if self.counts[r][j][0]:
                    rows.append({"region": name, "position": j, **self._rates(self.counts[r][j])})
        return rows

    def calibration(self) -> list[dict]:
        rows = []
        for i, (n, correct) in enumerate(self.bins):
            if n:
                rows.append({"entropy_from": ENTROPY_BINS[i], "entropy_to": ENTROPY_BINS[i + 1], "tokens": n,
                             "accuracy": 100 * correct / n})
        return rows

    def to_dict(self) -> dict:
        return {"block_size": self.block_size, "sequences": self.sequences, "headline": self.headline(),
                "by_position": self.by_position(), "calibration": self.calibration()}

    def to_markdown(self) -> str:
        h = self.headline()
        lines = [f"Teacher-forced top-1 accuracy, block size {self.block_size}, {self.sequences} sequences, "
                 f"{h['tokens']} tokens.", "",
                 "| blocks | NTP % | masked, left context % | masked, fully masked % | gap (masked − NTP) |",
                 "|---|---:|---:|---:|---:|"]
        for name, regions in (("all", (0, 1)), ("interior", (0,)), ("final (holds EOS)", (1,))):
            rates = self._rates(self._totals(regions))
            if rates["tokens"]:
                lines.append(f"| {name} | {rates['ntp_acc']:.1f} | {rates['masked_acc']:.1f} | "
                             f"{rates['full_mask_acc']:.1f} | {rates['masked_acc'] - rates['ntp_acc']:+.1f} |")
        lines += ["", "By block position (all blocks):", "",
                  "| position | tokens | NTP % | left context % | fully masked % |", "|---:|---:|---:|---:|---:|"]
        for j in range(self.block_size):
            c = [self.counts[0][j][i] + self.counts[1][j][i] for i in range(4)]
            if c[0]:
                r = self._rates(c)
                lines.append(f"| {j} | {c[0]} | {r['ntp_acc']:.1f} | {r['masked_acc']:.1f} | {r['full_mask_acc']:.1f} |")
        lines += ["", "Entropy calibration of the masked (left context) predictions:", "",
                  "| entropy (nats) | tokens | accuracy % |", "|---|---:|---:|"]
        for row in self.calibration():
            lines.append(f"| [{row['entropy_from']:g}, {row['entropy_to']:g}) | {row['tokens']} | "
                         f"{row['accuracy']:.1f} |")
        return "\n".join(lines) + "\n"


def _mask_id(model) -> int:
    mask_id = getattr(model.config, "sbd_mask_token_id", None)
    if mask_id is None:
        raise SBDError("this model has no SBD mask token (config.sbd_mask_token_id): it was not SBD-trained")
    return int(mask_id)


@torch.inference_mode()
def _score_sequence(model, ids: list[int], start: int, k: int, mask_id: int, eos: set[int],
                    report: ConvergenceReport) -> None:
    device = model.get_input_embeddings().weight.device
    n = len(ids)
    x = torch.tensor([ids], device=device)
    cache = slab_cache(model, n + k)
    causal = model(input_ids=x, position_ids=torch.arange(n, device=device)[None],
                   attention_mask=causal_mask(torch.zeros(1, dtype=torch.long, device=device), n),
                   **with_cache(model, cache), use_cache=True).logits[0]
    targets = torch.arange(start, n, device=device)                   # one row per scored token
    rows = targets.numel()
    offset = targets - start
    block_start = start + offset // k * k
    j = offset % k
    # row r: its block's true tokens before j, masks from j on
    i = torch.arange(k, device=device)
    pos = block_start[:, None] + i[None]
    true = x[0].gather(0, pos.clamp(max=n - 1).flatten()).view(rows, k)
    block = torch.where(i[None] < j[:, None], true, mask_id)
    select_rows(cache, torch.zeros(rows, dtype=torch.long, device=device))
    kv = torch.arange(n + k, device=device)
    attend = (kv[None] < block_start[:, None]) | (kv[None] >= n)       # own prefix + own block
    with gated(model, 0):  # a drafting adapter acts on the block (the whole of this forward)
        logits = model(input_ids=block, position_ids=pos,
                       attention_mask=attend[:, None, None, :].expand(rows, 1, k, n + k),
                       **with_cache(model, cache), use_cache=True).logits.float()
    logits[..., mask_id] = torch.finfo(logits.dtype).min
    left = logits[torch.arange(rows, device=device), j]                 # (rows, V)
    truth = x[0, targets]
    ntp_ok = causal[targets - 1].argmax(-1) == truth
    left_ok = left.argmax(-1) == truth
    first_row = targets - j                                           # the j = 0 row of each token's block
    full_ok = logits[(first_row - start), j].argmax(-1) == truth
    entropy = error_proxy(left, "entropy")
    final_start = start + (n - 1 - start) // k * k if ids[-1] in eos else n  # block holding a final EOS
    region = (targets >= final_start).long()
    for r_, j_, a, b_, c_, h_ in zip(region.tolist(), j.tolist(), ntp_ok.tolist(), left_ok.tolist(),
                                      full_ok.tolist(), entropy.tolist()):
        cell = report.counts[r_][j_]
        cell[0] += 1
        cell[1] += a
        cell[2] += b_
        cell[3] += c_
        for bi in range(len(ENTROPY_BINS) - 1):
            if h_ < ENTROPY_BINS[bi + 1]:
                report.bins[bi][0] += 1
                report.bins[bi][1] += b_
                break
    report.sequences += 1


def convergence_check(model, examples, block_size: int = 16, eos_token_ids=None, progress: bool = False
                      ) -> ConvergenceReport:
    """Teacher-forced masked vs NTP accuracy of `model` on `examples`.

    examples: dicts with `input_ids` (prompt + completion, ending with EOS when the sequence is
    complete) and `prompt_length` (0 for plain text); blocks start at the first completion token (the
    second token for plain text, the first one NTP can predict).
    """
    if not isinstance(block_size, int) or block_size < 1:
        raise SBDError(f"block_size must be an integer >= 1, got {block_size!r}")
    mask_id = _mask_id(model)
    if eos_token_ids is None:
        eos = getattr(model.generation_config, "eos_token_id", None) or getattr(model.config, "eos_token_id", None)
        eos_token_ids = eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
    eos = {int(e) for e in eos_token_ids}
    report = ConvergenceReport(block_size)
    items = list(examples)
    if not items:
        raise SBDError("no examples to check")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc="convergence check", dynamic_ncols=True)
    try:
        with eval_mode(model):
            for ex in items:
                ids = list(ex["input_ids"])
                start = max(int(ex.get("prompt_length", 0) or 0), 1)
                if start < len(ids):
                    _score_sequence(model, ids, start, block_size, mask_id, eos, report)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return report


def heldout_examples(tokenizer, tasks, n: int, seed: int = 0, max_len: int = 1024) -> list[dict]:
    """`n` held-out problems per task (the test side of `sbd.tasks`), tokenized as training tokenizes them."""
    from ..tasks import make_split
    from .data import tokenize_records

    records = [{"prompt": ex["prompt"], "completion": ex["completion"]}
               for task in tasks for ex in make_split(task, "test", n, seed)]
    dataset = tokenize_records(records, tokenizer, max_len)
    return [dataset[i] for i in range(len(dataset))]
