"""Decode the same seeded held-out problems with NTP and with SBD at several γ, score every answer with
reasoning-gym, and measure the cost with the definitions of docs/method.md §5.

Speedups are always relative to NTP decoding of the same model on the same prompts, in the same process,
after a warm-up; wall times are medians over `repeats`, with the decoding configs interleaved inside
each repeat so that a slow spell on a shared machine hits all of them alike.
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass, field

from ..errors import SBDError
from ..decoding.generate import generate
from ..models.facts import default_eos_ids
from ..tasks import extract_answer, final_answer, get_task, make_split, score

DEFAULT_MAX_NEW_TOKENS = 128
ALL_TASKS = "all"  # the task name of the aggregate rows


@dataclass(frozen=True)
class Config:
    """One decoding setting: NTP, SBD at one γ, or SBD with verified drafts (block size is shared by every
    SBD config of a run)."""

    method: str
    gamma: float | None = None
    anchor: bool = False  # plain SBD anchored on the next-token head (`sbd.decoding.anchored`)

    @property
    def name(self) -> str:
        if self.method != "sbd":
            return self.method
        return f"sbd{' anchored' if self.anchor else ''} γ={self.gamma:g}"


@dataclass
class Decoded:
    """The outputs of one config over one task's problems (all batches of one repeat)."""

    texts: list[str]
    token_ids: list[list[int]]
    nfe: list[int]
    seconds: float
    accepted: list[int] = field(default_factory=list)  # sbd-verify: draft tokens kept per forward


def _check_int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SBDError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_gammas(gammas) -> list[float]:
    if isinstance(gammas, (str, int, float)):
        raise SBDError(f"gammas must be a list of numbers, got {gammas!r}")
    out = []
    for g in gammas:
        if isinstance(g, bool) or not isinstance(g, (int, float)) or math.isnan(g) or g < 0:
            raise SBDError(f"every γ must be a number >= 0 (inf allowed), got {g!r}")
        if float(g) not in out:
            out.append(float(g))
    return out


def validate(model, tasks, n, gammas, block_size, include_ntp, max_new_tokens, batch_size, repeats,
             include_verify: bool = False, anchor: bool = False) -> list[Config]:
    """Check every argument before any decoding; returns the configs to run, NTP first."""
    if isinstance(tasks, str) or not tasks:
        raise SBDError("tasks must be a non-empty list of task names")
    for t in tasks:
        get_task(t)
    if len(set(tasks)) != len(tasks):
        raise SBDError(f"a task is listed twice: {', '.join(tasks)}")
    for name, value in (("n", n), ("block_size", block_size), ("max_new_tokens", max_new_tokens),
                        ("batch_size", batch_size), ("repeats", repeats)):
        _check_int(name, value)
    gammas = _check_gammas(gammas)
    configs = ([Config("ntp")] if include_ntp else []) + [Config("sbd", g, anchor) for g in gammas]
    configs += [Config("sbd-verify")] if include_verify else []
    if not configs:
        raise SBDError("nothing to evaluate: give at least one γ or include NTP decoding")
    if (gammas or include_verify) and getattr(model.config, "sbd_mask_token_id", None) is None:
        raise SBDError("this model has no SBD mask token (config.sbd_mask_token_id), so it cannot be decoded with "
                       "SBD: evaluate it with NTP only (no γ; `--gamma none` on the command line), or give it a "
                       "mask token with sbd.add_mask_token and fine-tune it with `sbd train --mode sbd`")
    return configs


def _decode(model, tokenizer, prompts, cfg: Config, block_size, max_new_tokens, batch_size, bar,
            chat: bool = False) -> Decoded:
    """All prompts in batches of `batch_size`; the time is the sum of the generate calls' wall times."""
    out = Decoded([], [], [], 0.0)
    kw = {"block_size": block_size, "gamma": cfg.gamma, "anchor": cfg.anchor} if cfg.method == "sbd" else {}
    if cfg.method == "sbd-verify":
        kw = {"block_size": block_size}
    for start in range(0, len(prompts), batch_size):
        r = generate(model, tokenizer, prompts[start:start + batch_size], method=cfg.method,
                     max_new_tokens=max_new_tokens, temperature=0.0, chat=chat, **kw)
        out.texts += r.texts
        out.token_ids += r.token_ids
        out.nfe += r.nfe
        out.seconds += r.seconds
        out.accepted += [a for row in r.accepted for a in row]
        bar.update(1)
    return out


def _reference_tokens(tokenizer, examples) -> list[int]:
    """Tokens of each reference completion as training renders it (completion tokens + EOS)."""
    return [len(tokenizer(ex["completion"], add_special_tokens=False).input_ids) + 1 for ex in examples]


def _row(task, label, cfg, examples, runs: list[Decoded], block_size, max_new_tokens, batch_size, repeats, seed,
         eos, reference, keep_outputs, chat: bool = False) -> dict:
    """Metrics of one (task, config) from its runs: outputs from the first repeat (decoding is
    deterministic at temperature 0), time = median over repeats. accuracy is the mean reasoning-gym score
    (some scorers give partial credit, e.g. chain_sum's decimal reward); exact_match counts score 1.0 only."""
    first = runs[0]
    scores = [score(task, ex["entry"], text, chat=chat) for ex, text in zip(examples, first.texts)]
    read = final_answer if chat else extract_answer
    tokens, nfe = sum(len(t) for t in first.token_ids), sum(first.nfe)
    seconds = statistics.median(r.seconds for r in runs)
    row = {
        "task": task, "label": label, "method": cfg.method, "gamma": cfg.gamma, "anchor": cfg.anchor,
        "block_size": block_size if cfg.method != "ntp" else None, "n": len(examples),
        "accuracy": sum(scores) / len(scores), "exact_match": sum(s >= 1.0 for s in scores) / len(scores),
        "correct": sum(s >= 1.0 for s in scores),
        "scores": scores,  # per problem, in order: paired comparisons between configurations
        "answers": [read(text) for text in first.texts],  # the final answer read from each output
        "token_ids": first.token_ids,  # agreement with NTP, token for token (dropped from results.json)
        "chat": chat,
        "mean_nfe": nfe / len(examples), "nfe": nfe, "tokens": tokens, "mean_tokens": tokens / len(examples),
        "tokens_per_forward": tokens / nfe if nfe else 0.0,
        "seconds": seconds, "seconds_runs": [r.seconds for r in runs],
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "nfe_speedup": None, "wallclock_speedup": None,
        "truncated": sum(1 for ids in first.token_ids if len(ids) >= max_new_tokens and ids[-1] not in eos),
        "reference_tokens": sum(reference) / len(reference),
        "max_new_tokens": max_new_tokens, "batch_size": batch_size, "repeats": repeats, "seed": seed,
    }
    if first.accepted:
        row["mean_accepted"] = sum(first.accepted) / len(first.accepted)
    if keep_outputs:
        row["outputs"] = [{"prompt": ex["prompt"], "reference": ex["completion"], "text": text, "score": s,
                           "nfe": f, "tokens": len(ids)}
                          for ex, text, s, f, ids in zip(examples, first.texts, scores, first.nfe, first.token_ids)]
    return row


def _aggregate(task_rows: list[dict]) -> dict:
    """The "all tasks" row of one config: accuracy is the mean over tasks, counts and times are totals."""
    first = task_rows[0]
    nfe, tokens = sum(r["nfe"] for r in task_rows), sum(r["tokens"] for r in task_rows)
    seconds, n = sum(r["seconds"] for r in task_rows), sum(r["n"] for r in task_rows)
    return {
        **{k: first[k] for k in ("label", "method", "gamma", "block_size")}, "task": ALL_TASKS, "n": n,
        **{k: first[k] for k in ("anchor", "chat") if k in first},
        "accuracy": sum(r["accuracy"] for r in task_rows) / len(task_rows),
        "exact_match": sum(r["exact_match"] for r in task_rows) / len(task_rows),
        "correct": sum(r["correct"] for r in task_rows),
        "mean_nfe": nfe / n, "nfe": nfe, "tokens": tokens, "mean_tokens": tokens / n,
        "tokens_per_forward": tokens / nfe if nfe else 0.0, "seconds": seconds,
        "seconds_runs": [sum(x) for x in zip(*(r["seconds_runs"] for r in task_rows))],
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "nfe_speedup": None, "wallclock_speedup": None,
        "truncated": sum(r["truncated"] for r in task_rows),
        "reference_tokens": sum(r["reference_tokens"] * r["n"] for r in task_rows) / n,
        **{k: first[k] for k in ("max_new_tokens", "batch_size", "repeats", "seed")},
        **({k: sum(r[k] * r["n"] for r in task_rows) / n for k in ("same_answer", "same_tokens")}
           if all("same_answer" in r for r in task_rows) else {}),
    }


def _add_speedups(rows: list[dict]) -> None:
    """NFE and wall-clock speedup of each row against the NTP row of the same task (same model, prompts),
    and, for task rows, how often it agrees with NTP: the same final answer, the same tokens."""
    ntp = next((r for r in rows if r["method"] == "ntp"), None)
    if ntp is None:
        return
    for r in rows:
        r["nfe_speedup"] = ntp["nfe"] / r["nfe"] if r["nfe"] else None
        r["wallclock_speedup"] = ntp["seconds"] / r["seconds"] if r["seconds"] > 0 else None
        if "answers" in r and "answers" in ntp:
            r["same_answer"] = sum(a == b for a, b in zip(r["answers"], ntp["answers"])) / r["n"]
            r["same_tokens"] = sum(a == b for a, b in zip(r["token_ids"], ntp["token_ids"])) / r["n"]


def evaluate(model, tokenizer, tasks: list[str], n: int, gammas: list[float], block_size: int = 16,
             include_ntp: bool = True, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, batch_size: int = 1,
             repeats: int = 1, seed: int = 0, label: str = "model", progress: bool = True,
             keep_outputs: bool = False, include_verify: bool = False, chat: bool = False,
             anchor: bool = False) -> list[dict]:
    """Rows of metrics, one per (task, config) plus one "all" row per config; configs are NTP (if
    `include_ntp`) and SBD at each γ in `gammas` with `block_size`. Every config decodes the same `n`
    held-out problems per task (`make_split(task, "test", n, seed)`) from the rendered prompt, greedily.
    `include_verify` adds SBD with verified drafts (`method="sbd-verify"`, same block size), whose answers
    must equal NTP's. `keep_outputs` adds each row's generated texts and scores under "outputs".
    `chat`: each problem's bare question goes through the tokenizer's chat template (an instruction-tuned
    model answers in its own words), and its final answer is read with `sbd.tasks.final_answer`. Every row
    records how often its final answer (`same_answer`) and its tokens (`same_tokens`) equal NTP's.
    `anchor`: the SBD configs decode with plain SBD anchored on the next-token head (`sbd.generate`'s
    anchor)."""
    from tqdm.auto import tqdm

    configs = validate(model, tasks, n, gammas, block_size, include_ntp, max_new_tokens, batch_size, repeats,
                       include_verify, anchor)
    examples = {t: make_split(t, "test", n, seed) for t in tasks}
    prompts = {t: [ex["entry"]["question"] if chat else ex["prompt"] for ex in examples[t]] for t in tasks}
    reference = {t: _reference_tokens(tokenizer, examples[t]) for t in tasks}
    longest = max(max(v) for v in reference.values())
    if longest > max_new_tokens:
        warnings.warn(f"max_new_tokens={max_new_tokens} is shorter than the longest reference completion "
                      f"({longest} tokens with EOS): some answers cannot be complete", stacklevel=2)
    eos = set(default_eos_ids(model, tokenizer))
    batches = math.ceil(n / batch_size)
    bar = tqdm(total=len(configs) + len(tasks) * repeats * len(configs) * batches, unit="batch",
               desc=f"eval {label}", disable=not progress)
    rows: list[dict] = []
    try:
        warm = prompts[tasks[0]][:batch_size]
        for cfg in configs:  # warm-up: first calls pay for lazy initialisation, kept out of the timing
            bar.set_postfix_str(f"warm-up {cfg.name}")
            _decode(model, tokenizer, warm, cfg, block_size, min(max_new_tokens, 2 * block_size), batch_size, bar,
                    chat)
        for task in tasks:
            runs: dict[Config, list[Decoded]] = {cfg: [] for cfg in configs}
            for _ in range(repeats):
                for cfg in configs:
                    bar.set_postfix_str(f"{task} {cfg.name}")
                    runs[cfg].append(_decode(model, tokenizer, prompts[task], cfg, block_size, max_new_tokens,
                                             batch_size, bar, chat))
            task_rows = [_row(task, label, cfg, examples[task], runs[cfg], block_size, max_new_tokens, batch_size,
                              repeats, seed, eos, reference[task], keep_outputs, chat) for cfg in configs]
            _add_speedups(task_rows)
            rows += task_rows
    finally:
        bar.close()
    return add_totals(rows)


def add_totals(rows: list[dict]) -> list[dict]:
    """`rows` plus an "all" row for every (model label, config) that has task rows but no "all" row yet
    (evaluate's own output already has them; rows filtered or merged by hand may not)."""
    key = lambda r: (r["label"], r["method"], r["gamma"])  # noqa: E731
    have = {key(r) for r in rows if r["task"] == ALL_TASKS}
    missing = [k for k in dict.fromkeys(key(r) for r in rows) if k not in have]
    totals = [_aggregate([r for r in rows if key(r) == k and r["task"] != ALL_TASKS]) for k in missing]
    for label in dict.fromkeys(t["label"] for t in totals):
        _add_speedups([t for t in totals if t["label"] == label])
    return rows + totals
