"""Training data: local jsonl or a reasoning-gym generator, tokenized once into a map-style dataset.

Records are `{"prompt", "completion"}` (loss on the completion only), `{"text"}` (loss everywhere), or
`sbd distill`'s records, whose `prompt_ids`/`completion_ids` are used as they are (no EOS appended: a
completion that hit its budget did not stop).
Every sequence ends with EOS so that a trained model learns to stop. `render_reasoning_gym` is the one
place that turns a reasoning-gym entry into a record; a richer renderer can replace it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from urllib.parse import parse_qs

import torch

from ..errors import SBDError

RG_PREFIX = "reasoning-gym:"


def render_reasoning_gym(entry: dict) -> dict:
    """Minimal rendering: the question as prompt, the answer as completion."""
    return {"prompt": entry["question"].rstrip() + "\n", "completion": str(entry["answer"])}


def _reasoning_gym_records(spec: str) -> list[dict]:
    name, _, query = spec[len(RG_PREFIX):].partition("?")
    if not name:
        raise SBDError(f"{spec!r}: give a generator name, e.g. reasoning-gym:chain_sum?size=1000&seed=1")
    params = {}
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key not in ("size", "seed"):
            raise SBDError(f"{spec!r}: unknown option {key!r} (use size and seed)")
        try:
            params[key] = int(values[-1])
        except ValueError:
            raise SBDError(f"{spec!r}: {key} must be an integer, got {values[-1]!r}") from None
    if params.get("size", 1) < 1:
        raise SBDError(f"{spec!r}: size must be >= 1")
    try:
        import reasoning_gym
    except ImportError:
        raise SBDError("reasoning-gym data needs the reasoning-gym package: pip install reasoning-gym") from None
    try:
        dataset = reasoning_gym.create_dataset(name, size=params.get("size", 1000), seed=params.get("seed", 0))
    except Exception as e:  # unknown names raise ValueError, bad configs other types
        raise SBDError(f"reasoning-gym cannot create {name!r}: {e}") from None
    return [render_reasoning_gym(entry) for entry in dataset]


def _jsonl_records(path: Path) -> list[tuple[int, object]]:
    """(line number, parsed JSON value) of each non-blank line."""
    if not path.exists():
        raise SBDError(f"data file {str(path)!r} does not exist")
    if not path.is_file():
        raise SBDError(f"data path {str(path)!r} is not a file (expected a .jsonl file)")
    records = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SBDError(f"{path}:{n}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                               "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                records.append((n, json.loads(line)))
            except ValueError as e:
                raise SBDError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return records


def load_records(spec: str) -> list[dict]:
    """Records from `FILE.jsonl` or `reasoning-gym:NAME?size=N&seed=S`; checks their fields."""
    spec = str(spec)
    if spec.startswith(RG_PREFIX):
        numbered = [(f"record {n} of {spec!r}", r) for n, r in enumerate(_reasoning_gym_records(spec), 1)]
    else:
        numbered = [(f"{spec}:{line}", r) for line, r in _jsonl_records(Path(spec))]  # file:line, as editors jump
    if not numbered:
        raise SBDError(f"no training records in {spec!r}")
    for where, r in numbered:
        _check_record(where, r)
    return [r for _, r in numbered]


def _check_record(where: str, r) -> None:
    """SBDError naming `where` (file:line) and the field, for a record no form of training data takes."""
    if not isinstance(r, dict):
        raise SBDError(f"{where}: the record is not a JSON object")
    if "prompt_ids" in r or "completion_ids" in r:  # `sbd distill` records: the exact tokens
        ok = all(isinstance(r.get(k), list) and all(isinstance(t, int) and not isinstance(t, bool) for t in r[k])
                 for k in ("prompt_ids", "completion_ids"))
        if not ok:
            raise SBDError(f"{where}: 'prompt_ids' and 'completion_ids' must both be lists of token ids")
        return
    if "text" in r and ("prompt" in r or "completion" in r):
        raise SBDError(f"{where}: the record has both 'text' and 'prompt'/'completion': keep one form "
                       "(text: loss everywhere; prompt/completion: loss on the completion)")
    if "text" in r:
        fields = ("text",)
    elif "prompt" in r or "completion" in r:
        fields = ("prompt", "completion")
        for have, lacks in (("prompt", "completion"), ("completion", "prompt")):
            if lacks not in r:
                raise SBDError(f"{where}: the record has {have!r} but no {lacks!r} field (a prompt/completion "
                               "record needs both 'prompt' and 'completion', as strings; or give one 'text' field)")
    else:
        raise SBDError(f"{where}: the record has neither 'text' nor 'prompt' and 'completion' fields "
                       f"(it has {', '.join(map(repr, r)) or 'none'})")
    for name in fields:
        if not isinstance(r[name], str):
            raise SBDError(f"{where}: {name!r} must be a string, got {type(r[name]).__name__}")


class TokenDataset(torch.utils.data.Dataset):
    """Tokenized records: each item is {"input_ids", "prompt_length", "index"}."""

    def __init__(self, examples: list[dict]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return {**self.examples[i], "index": i}


def tokenize_records(records: list[dict], tokenizer, max_len: int, mask_token_id: int | None = None) -> TokenDataset:
    """Tokenize, append EOS, truncate to `max_len` (counting and warning), and validate each record."""
    if not isinstance(max_len, int) or max_len < 2:
        raise SBDError(f"max_len must be an integer >= 2, got {max_len!r}")
    eos = tokenizer.eos_token_id
    tail = [eos] if eos is not None else []
    examples, truncated = [], 0
    for n, r in enumerate(records, 1):
        if "prompt_ids" in r:  # exact tokens as the model produced them (EOS included when it stopped)
            prompt, ids = list(r["prompt_ids"]), list(r["prompt_ids"]) + list(r["completion_ids"])
            if any(not 0 <= t < len(tokenizer) for t in ids):
                raise SBDError(f"record {n}: a token id lies outside the tokenizer's vocabulary of {len(tokenizer)}")
        elif "text" in r:
            prompt, ids = [], tokenizer(r["text"]).input_ids + tail
        else:
            prompt = tokenizer(r["prompt"]).input_ids
            ids = prompt + tokenizer(r["completion"], add_special_tokens=False).input_ids + tail
        if len(prompt) >= max_len:
            raise SBDError(f"record {n}: its prompt has {len(prompt)} tokens, which leaves no room for the "
                           f"completion within max length {max_len}")
        if len(ids) < 2:
            raise SBDError(f"record {n} has {len(ids)} token(s); a training sequence needs at least 2")
        if len(ids) <= len(prompt):
            raise SBDError(f"record {n} has no completion tokens")
        if mask_token_id is not None and mask_token_id in ids:
            raise SBDError(f"record {n} contains the mask token {tokenizer.convert_ids_to_tokens(mask_token_id)!r}")
        if len(ids) > max_len:
            ids, truncated = ids[:max_len], truncated + 1
        examples.append({"input_ids": ids, "prompt_length": len(prompt)})
    if truncated:
        warnings.warn(f"{truncated} of {len(records)} sequences were longer than {max_len} tokens and were truncated",
                      stacklevel=2)
    return TokenDataset(examples)
