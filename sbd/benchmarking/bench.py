"""`bench`: how fast each way of decoding is on one model, one prompt set, in one process.

Rows: Hugging Face greedy `generate`, prompt-lookup decoding, assisted decoding (when an assistant
model is given), our NTP loop, SBD at each γ and SBD-verify. One untimed pass records every method's
tokens and the shape of every forward it made (it doubles as the warm-up); then `repeats` timed
passes run the methods in turn on each batch of prompts (interleaved, so machine noise hits all alike)
and the median of the summed times is taken.

The limit (SPEC eq. 16 summed over the forwards a run actually made): after the timed passes every
distinct forward shape our loops used is timed alone (`time_forwards`); the sum over a run's forwards
is the time it would take if the loop around the model cost nothing. The predicted speedup of a row
is (limit of our NTP loop) / (limit of the row), and `share` = measured speedup / predicted speedup.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

from ..decoding.generate import check_prompt_ids, encode_prompts, generate
from ..models.facts import default_eos_ids
from ..errors import SBDError
from ..models.narrow_linear import linear_layers, uses_narrow_linear
from ..modes import eval_mode
from .forward_cost import Shape, _sync, time_forwards
from .ties import parting_gaps, tie_gap

KINDS = ("hf", "prompt-lookup", "assisted", "ntp", "sbd", "sbd-verify", "sbd-verify-adaptive", "sbd-verify-lookup",
         "sbd-verify-adaptive-lookup", "sbd-verify-defaults", "sbd-fixed")
VERIFY = ("sbd-verify", "sbd-verify-adaptive", "sbd-verify-lookup", "sbd-verify-adaptive-lookup", "sbd-verify-defaults")
LAYERS = {"narrow": True, "flinear": False}  # --methods NAME@LAYERS: that row on these linear layers
PROMPT_LOOKUP_TOKENS = 10  # Hugging Face's documented example value; the n-gram size is its default


@dataclass(frozen=True)
class Method:
    """One row of the benchmark: a way of decoding and its settings."""

    kind: str
    gamma: float | None = None  # sbd only
    block_size: int | None = None  # sbd and sbd-verify
    compiled: bool = False  # our loops through torch.compile on static shapes
    fixed: int | None = None  # sbd-fixed: tokens revealed per forward (a timing schedule)
    # linear layers of few-token forwards as W·xᵀ (True) or F.linear (False); None: ours as loaded, Hugging
    # Face's rows on torch's own layers (stock transformers: the baseline a user has without sbd)
    narrow: bool | None = None

    @property
    def name(self) -> str:
        linear = {None: "", True: ", narrow linear", False: ", F.linear"}[self.narrow]
        return self._base_name + (", compiled" if self.compiled else "") + linear

    @property
    def _base_name(self) -> str:
        if self.kind == "sbd":
            return f"SBD γ={self.gamma:g}, block {self.block_size}"
        if self.kind == "sbd-verify":
            return f"SBD-verify, block {self.block_size}"
        if self.kind == "sbd-verify-adaptive":
            return f"SBD-verify adaptive, block ≤ {self.block_size}"
        if self.kind == "sbd-verify-lookup":
            return f"SBD-verify + lookup, block {self.block_size}"
        if self.kind == "sbd-verify-adaptive-lookup":
            return f"SBD-verify adaptive + lookup, block ≤ {self.block_size}"
        if self.kind == "sbd-verify-defaults":
            return f"SBD-verify (the model's defaults), block {self.block_size}"
        if self.kind == "sbd-fixed":
            return f"SBD fixed {self.fixed}/forward, block {self.block_size}"
        return {"hf": "HF greedy generate", "prompt-lookup": f"HF prompt-lookup ({PROMPT_LOOKUP_TOKENS})",
                "assisted": "HF assisted (assistant model)", "ntp": "sbd NTP loop"}[self.kind]

    @property
    def ours(self) -> bool:
        return self.kind in ("ntp", "sbd", "sbd-fixed", *VERIFY)

    @property
    def lossless(self) -> bool:
        """Greedy output must equal greedy NTP decoding (all but plain and fixed-schedule SBD)."""
        return self.kind not in ("sbd", "sbd-fixed")

    @property
    def batch_one_only(self) -> bool:
        """Hugging Face's candidate-generator decoding runs one prompt at a time."""
        return self.kind in ("prompt-lookup", "assisted")


def parse_methods(text: str, gammas: Sequence[float], block_sizes: Sequence[int] | int, assistant: bool,
                  compiled: bool = False, fixed: Sequence[int] = (2, 3, 4),
                  narrow: Sequence[bool | None] = (None,)) -> list[Method]:
    """`hf,prompt-lookup,ntp,sbd,sbd-verify` → Methods; `sbd` expands to one row per (block size, γ) and
    `sbd-verify` to one per block size; `assisted` needs an assistant model. Our NTP loop is always
    included (the predicted speedups are relative to it). compiled: each of our rows again, compiled.
    `sbd-fixed` expands to one row per (block size, tokens revealed per forward in `fixed`).
    narrow: the linear-layer settings to compare (`sbd.models.narrow_linear`); every method but our NTP loop
    (run as loaded) gets a row per setting. Left at None, Hugging Face's rows run on torch's own linear
    layers (stock transformers), ours as loaded."""
    sizes = [block_sizes] if isinstance(block_sizes, int) else list(block_sizes)
    names, pinned = [], {}  # pinned: "name@narrow" / "name@flinear", a method on the linear layers named
    for t in (t.strip() for t in text.split(",")):
        name, _, layers = t.partition("@")
        if not name:
            continue
        if layers and (layers not in LAYERS or name == "ntp"):
            raise SBDError(f"unknown linear layers {t!r}: write NAME@narrow or NAME@flinear (not for ntp)")
        names.append(t)
        if layers:
            pinned[t] = name
    unknown = [n for n in names if pinned.get(n, n) not in KINDS]
    if unknown or not names:
        raise SBDError(f"unknown method {', '.join(unknown) or '(none)'}; choose from {', '.join(KINDS)}")
    if not sizes or any(not isinstance(k, int) or k < 1 for k in sizes):
        raise SBDError("block sizes must be integers >= 1")
    if "assisted" in names and not assistant:
        raise SBDError("method 'assisted' needs an assistant model (--assistant PATH, same tokenizer)")
    if assistant and "assisted" not in names:
        names.append("assisted")
    if "ntp" not in names:
        names.insert(names.index("sbd") if "sbd" in names else len(names), "ntp")
    methods = []
    for n in dict.fromkeys(names):
        if n in pinned:  # one row on the named layers, whatever `narrow` says
            kind, layers = pinned[n], LAYERS[n.partition("@")[2]]
            rows = parse_methods(kind, gammas, sizes, assistant, False, fixed)
            methods += [Method(m.kind, m.gamma, m.block_size, False, m.fixed, layers) for m in rows if m.kind == kind]
            continue
        if n == "sbd":
            if not gammas:
                raise SBDError("method 'sbd' needs at least one γ")
            methods += [Method("sbd", float(g), k) for k in sizes for g in gammas]
        elif n in VERIFY:
            methods += [Method(n, None, k) for k in sizes]
        elif n == "sbd-fixed":
            if not fixed or any(r < 1 for r in fixed):
                raise SBDError("method 'sbd-fixed' needs tokens per forward >= 1")
            methods += [Method("sbd-fixed", None, k, fixed=r) for k in sizes for r in fixed]
        else:
            methods.append(Method(n))
    if compiled:
        methods += [Method(m.kind, m.gamma, m.block_size, True, m.fixed) for m in methods if m.ours]
    settings = list(dict.fromkeys(narrow)) or [None]
    if settings != [None]:
        methods = [m if m.kind == "ntp" or m.narrow is not None else
                   Method(m.kind, m.gamma, m.block_size, m.compiled, m.fixed, s)
                   for m in methods for s in (settings if m.kind != "ntp" and m.narrow is None else [None])]
    methods = list(dict.fromkeys(methods))
    return methods


@dataclass
class Run:
    """What one method produced on all prompts (from the recording pass) and the forwards it made."""

    tokens: list[list[int]]
    nfe: list[int] | None
    forwards: list[Shape] = field(default_factory=list)


@dataclass
class BenchRow:
    """One method at one batch size. Times in seconds; speedups are ratios of medians."""

    method: str
    kind: str
    batch_size: int
    gamma: float | None
    block_size: int | None
    seconds: float  # median over the timed passes of the summed wall time of all batches
    all_seconds: list[float]
    tokens: int
    tokens_per_second: float
    speedup_vs_hf: float | None  # HF greedy seconds / this row's seconds
    nfe: int | None  # forwards, prefill excluded (our loops only)
    tokens_per_forward: float | None
    same_as_greedy: int  # answers identical to the greedy reference, token for token
    n: int
    lossless: bool
    accuracy: float | None = None
    near_ties: int = 0  # of the answers that differ, those parting from the reference at a near tie (ties.py)
    parting_gaps: list | None = None  # lossless rows: the logit gap where each differing answer parts (ties.py)
    measured_vs_ntp: float | None = None  # our NTP loop's seconds / this row's seconds
    limit_seconds: float | None = None  # Σ over this row's forwards of the forward's time alone
    predicted_vs_ntp: float | None = None  # limit of our NTP loop / limit of this row (eq. 16)
    share_of_limit: float | None = None  # measured_vs_ntp / predicted_vs_ntp

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class BenchResult:
    rows: list[BenchRow]
    meta: dict

    def to_dict(self) -> dict:
        return {"meta": self.meta, "rows": [r.to_dict() for r in self.rows]}


def _cut_at_eos(ids: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


def _hf_generate(model, tokenizer, batch: list[list[int]], max_new: int, eos: list[int], assistant=None,
                 **kw) -> list[list[int]]:
    """Left-padded Hugging Face `generate`, greedy; new tokens per row up to and including EOS."""
    device = model.get_input_embeddings().weight.device
    longest = max(len(p) for p in batch)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = pad_id if pad_id is not None else eos[0] if eos else 0
    ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), longest), dtype=torch.long)
    for i, p in enumerate(batch):
        ids[i, longest - len(p):] = torch.tensor(p)
        attn[i, longest - len(p):] = 1
    if assistant is not None:
        kw["assistant_model"] = assistant
    out = model.generate(ids.to(device), attention_mask=attn.to(device), max_new_tokens=max_new, do_sample=False,
                         pad_token_id=pad_id, eos_token_id=eos or None, **kw)
    return [_cut_at_eos(row[longest:].tolist(), set(eos)) for row in out]


def _run(method: Method, model, tokenizer, batch, max_new, eos, assistant, record: list | None):
    """Decode one batch with `method`; returns (tokens per row, NFE per row or None)."""
    with linear_layers(model, method.narrow if method.narrow is not None or method.ours else False):
        return _decode(method, model, tokenizer, batch, max_new, eos, assistant, record)


def _decode(method: Method, model, tokenizer, batch, max_new, eos, assistant, record: list | None):
    if method.kind == "hf":
        return _hf_generate(model, tokenizer, batch, max_new, eos), None
    if method.kind == "prompt-lookup":
        return _hf_generate(model, tokenizer, batch, max_new, eos, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS), None
    if method.kind == "assisted":
        return _hf_generate(model, tokenizer, batch, max_new, eos, assistant=assistant), None

    def observe(rec):
        # rows have their own cache lengths: the forward is timed at the longest one
        record.append(Shape(rec.input_ids.shape[0], rec.input_ids.shape[1], max(rec.lengths), rec.n_commit))

    kw = {"gamma": method.gamma} if method.kind == "sbd" else {}
    if method.kind == "sbd-fixed":
        kw["reveal_per_forward"] = method.fixed
    if method.block_size is not None:
        kw["block_size"] = method.block_size
    if method.kind in VERIFY and method.kind != "sbd-verify-defaults":  # explicit: not the model's defaults
        kw["draft"] = "adaptive" if "-adaptive" in method.kind else "block"
        kw["lookup"] = method.kind.endswith("-lookup")
        kw["tree"] = "chain"
    kind = "sbd" if method.kind == "sbd-fixed" else "sbd-verify" if method.kind in VERIFY else method.kind
    r = generate(model, tokenizer, batch, method=kind, max_new_tokens=max_new, eos_token_ids=eos,
                 observer=observe if record is not None else None, compile=method.compiled, **kw)
    return r.token_ids, r.nfe


def _bucket(shape: Shape, step: int = 32) -> Shape:
    """Cached lengths rounded down to a multiple of `step`: fewer shapes to time, same cost to ~1%."""
    return Shape(shape.batch, shape.width, shape.cached // step * step, shape.n_commit)


def _check_inputs(model, tokenizer, prompts, methods, batch_sizes, repeats, max_new_tokens, assistant):
    if not prompts:
        raise SBDError("no prompts to benchmark")
    if repeats < 1:
        raise SBDError(f"repeats must be >= 1, got {repeats}")
    if max_new_tokens < 1:
        raise SBDError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise SBDError("batch sizes must be integers >= 1")
    if any(m.kind in ("sbd", "sbd-fixed", *VERIFY) for m in methods) and getattr(model.config, "sbd_mask_token_id", None) is None:
        raise SBDError("this model has no SBD mask token: benchmark it with methods hf,prompt-lookup,ntp only, "
                       "or fine-tune it with `sbd train` first")
    if assistant is not None and tokenizer is not None:
        a_vocab = assistant.get_input_embeddings().num_embeddings
        if a_vocab < len(tokenizer):
            raise SBDError("the assistant model's vocabulary is smaller than the tokenizer's: assisted decoding "
                           "needs an assistant with the same tokenizer")


def bench(model, tokenizer, prompts: Sequence, methods: Sequence[Method], *, batch_sizes: Sequence[int] = (1,),
          repeats: int = 3, max_new_tokens: int = 128, examples: Sequence[dict] | None = None, assistant=None,
          limit_repeats: int = 5, progress: bool = True, chat: bool = False) -> BenchResult:
    """Time every method on the same prompts; see the module docstring for what is measured.

    prompts: strings or token-id lists. examples: task problems ({task, entry}) aligned with the prompts,
    to score accuracy. assistant: a small model with the same tokenizer, for assisted decoding.
    chat: string prompts go through the tokenizer's chat template (every method sees the same ids).
    """
    from tqdm.auto import tqdm

    _check_inputs(model, tokenizer, prompts, methods, batch_sizes, repeats, max_new_tokens, assistant)
    prompt_ids = encode_prompts(tokenizer, list(prompts), chat)
    check_prompt_ids(model, tokenizer, prompt_ids)  # before any row: HF's rows would not refuse a mask token
    eos = default_eos_ids(model, tokenizer)
    device = model.get_input_embeddings().weight.device
    rows: list[BenchRow] = []
    plans = [(b, [m for m in methods if b == 1 or not m.batch_one_only]) for b in batch_sizes]
    total = sum((repeats + 1) * -(-len(prompt_ids) // b) * len(ms) for b, ms in plans)
    bar = tqdm(total=total, desc="bench", unit="call", disable=not progress)
    try:
        with eval_mode(model), torch.inference_mode():
            for b, ms in plans:
                batches = [prompt_ids[i: i + b] for i in range(0, len(prompt_ids), b)]
                runs = {m: Run([], [] if m.ours else None) for m in ms}
                for batch in batches:  # the recording pass, untimed: outputs and forward shapes; warm-up
                    for m in ms:
                        record = runs[m].forwards if m.ours else None
                        tokens, nfe = _run(m, model, tokenizer, batch, max_new_tokens, eos, assistant, record)
                        runs[m].tokens += tokens
                        if nfe is not None:
                            runs[m].nfe += nfe
                        bar.update()
                seconds = {m: [] for m in ms}
                for _ in range(repeats):
                    spent = dict.fromkeys(ms, 0.0)
                    for batch in batches:
                        for m in ms:
                            _sync(device)
                            start = time.perf_counter()
                            _run(m, model, tokenizer, batch, max_new_tokens, eos, assistant, None)
                            _sync(device)
                            spent[m] += time.perf_counter() - start
                            bar.update()
                    for m in ms:
                        seconds[m].append(spent[m])
                limits = _limits(model, runs, limit_repeats)
                rows += _rows(ms, b, runs, seconds, limits, examples, tokenizer, model, prompt_ids)
    finally:
        bar.close()
    meta = {
        "machine": platform.platform(), "processor": platform.processor() or platform.machine(),
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "threads": torch.get_num_threads(), "dtype": str(model.dtype).replace("torch.", ""),
        "prompts": len(prompt_ids), "batch_sizes": list(batch_sizes), "repeats": repeats,
        "max_new_tokens": max_new_tokens, "model_parameters": sum(p.numel() for p in model.parameters()),
        "narrow_linear_as_loaded": uses_narrow_linear(model),
    }
    return BenchResult(rows, meta)


def _limits(model, runs: dict, repeats: int) -> dict:
    """Per method: the summed standalone time of the forwards it made (None for Hugging Face rows)."""
    runs = {m: run for m, run in runs.items() if not m.compiled and m.ours}  # forwards are timed eagerly
    ntp = next((m for m in runs if m.kind == "ntp"), None)
    limits, ntp_limit = {}, None
    for narrow in dict.fromkeys(m.narrow for m in runs):  # each linear-layer setting times its own forwards
        group = {m: run for m, run in runs.items() if m.narrow == narrow}
        if ntp is not None:
            group[ntp] = runs[ntp]  # timed in every group: its limit is the group's yardstick
        shapes = {_bucket(s) for run in group.values() for s in run.forwards}
        if not shapes:
            continue
        with linear_layers(model, narrow):
            cost = time_forwards(model, sorted(shapes, key=lambda s: (s.batch, s.cached, s.width, s.n_commit)),
                                 repeats=repeats)
        times = {m: sum(cost[_bucket(s)] for s in run.forwards) for m, run in group.items()}
        # groups are timed minutes apart on a machine whose speed drifts: scale each to the first group's NTP
        scale = ntp_limit / times[ntp] if ntp is not None and ntp_limit is not None and times[ntp] > 0 else 1.0
        if ntp is not None and ntp_limit is None:
            ntp_limit = times[ntp]
        limits.update({m: t * scale for m, t in times.items() if m not in limits})
    return limits


def _rows(methods, b, runs, seconds, limits, examples, tokenizer, model, prompt_ids) -> list[BenchRow]:
    hf = next((m for m in methods if m.kind == "hf"), None)
    ntp = next(m for m in methods if m.kind == "ntp")
    reference = runs[hf].tokens if hf is not None else runs[ntp].tokens
    med = {m: statistics.median(s) for m, s in seconds.items()}
    out = []
    for m in methods:
        run = runs[m]
        n_tokens = sum(len(t) for t in run.tokens)
        nfe = sum(run.nfe) if run.nfe is not None else None
        acc = None
        if examples is not None:
            from ..tasks import score

            texts = [tokenizer.decode(t, skip_special_tokens=True) for t in run.tokens]
            acc = sum(score(ex["task"], ex["entry"], t) >= 1.0 for ex, t in zip(examples, texts)) / len(texts)
        row = BenchRow(
            method=m.name, kind=m.kind, batch_size=b, gamma=m.gamma, block_size=m.block_size, seconds=med[m],
            all_seconds=seconds[m], tokens=n_tokens, tokens_per_second=n_tokens / med[m],
            speedup_vs_hf=med[hf] / med[m] if hf is not None else None, nfe=nfe,
            tokens_per_forward=n_tokens / nfe if nfe else None,
            same_as_greedy=sum(a == r for a, r in zip(run.tokens, reference)), n=len(reference),
            lossless=m.lossless, accuracy=acc,
        )
        if m.lossless:
            row.parting_gaps = parting_gaps(model, prompt_ids, run.tokens, reference)
            row.near_ties = sum(g is not None and g < tie_gap(model.dtype) for g in row.parting_gaps)
        if m.ours:
            row.measured_vs_ntp = med[ntp] / med[m]
        if m.ours and not m.compiled:
            row.limit_seconds = limits[m]
            row.predicted_vs_ntp = limits[ntp] / limits[m]
            row.share_of_limit = row.measured_vs_ntp / row.predicted_vs_ntp
        out.append(row)
    return out
