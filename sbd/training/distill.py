"""Self-distilled training data: the model's own completions of a prompt set (`sbd distill`).

sbd-verify accepts a draft token exactly when it is what the model itself would say, so the drafts
should learn the model's own outputs rather than reference solutions. Each record keeps the exact
token ids the model produced (`prompt_ids`, `completion_ids`: no re-tokenisation drift) next to the
text, the prompt's `index` and its `source`. Records are written in the order the answers finish.

Decoding keeps `batch_size` prompts in flight: when one ends, the next prompt takes its place at once
(continuous batching), and its record is appended at once. Each answer is exactly what
`sbd.generate(method="ntp")` gives for that prompt alone (with temperature > 0: seed + index).

Data is never lost: `OUT.meta.json` records the settings and prompts (`sbd.training.distill_file`), an
existing --out that is not this run's output is refused untouched, appends are fsynced every few
records, and the only rewrite (dropping a torn last line after a crash) is atomic. The same command
continues where an interrupted run stopped.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from ..errors import SBDError
from . import distill_file as files

ADOPT_CHECKED = 4  # records of an adopted file decoded again, to check the temperature and seed it was made with
SYNC_RECORDS = 16  # fsync after this many records …
SYNC_SECONDS = 10.0  # … or this many seconds, whichever comes first


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _settings(model_name, chat, max_new_tokens, temperature, seed) -> dict:
    """What the sidecar records and a resume must repeat (`distill_file.SETTINGS`), checked."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise SBDError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or math.isnan(temperature) or temperature < 0:
        raise SBDError(f"temperature must be a number >= 0, got {temperature!r}")
    if not isinstance(seed, int):
        raise SBDError(f"seed must be an integer, got {seed!r}")
    return {"model": str(model_name), "chat": bool(chat), "max_new_tokens": max_new_tokens,
            "temperature": float(temperature), "seed": seed}


def _as_sources(prompts) -> list[tuple[str, list]]:
    """(source, prompts) pairs; a plain list of prompts is one source named "prompts"."""
    if isinstance(prompts, dict):
        return [(str(k), list(v)) for k, v in prompts.items()]
    prompts = list(prompts)
    if prompts and isinstance(prompts[0], tuple) and len(prompts[0]) == 2 and isinstance(prompts[0][0], str):
        return [(str(s), list(ps)) for s, ps in prompts]
    return [("prompts", prompts)]


def check(prompts, out, *, model_name: str, chat: bool = True, max_new_tokens: int = 256,
          temperature: float = 0.0, seed: int = 0, adopt: bool = False) -> files.Existing:
    """Everything that can be refused before a model is loaded: the arguments, and --out against its
    sidecar (another file, other prompts or settings). Writes nothing."""
    sources = _as_sources(prompts)
    if not any(ps for _, ps in sources):
        raise SBDError("no prompts to distill")
    settings = _settings(model_name, chat, max_new_tokens, temperature, seed)
    return files.inspect(out, settings, sources, adopt)


def distill(model, tokenizer, prompts, out, *, chat: bool = True, max_new_tokens: int = 256, batch_size: int = 8,
            temperature: float = 0.0, seed: int = 0, progress: bool = True, model_name: str | None = None,
            adopt: bool = False) -> int:
    """Append `{"index", "source", "prompt", "completion", "prompt_ids", "completion_ids"}` records of the
    model's own completions to `out` (jsonl), skipping prompts already there; returns how many were
    written. prompts: a list, or (source, prompts) pairs / a {source: prompts} dict (kept in the sidecar
    and in each record's `source`). model_name: the model as the user named it (default: its config's
    name_or_path). adopt: take over an output of an older sbd (no sidecar) after checking that every
    record answers the prompt at its index within max_new_tokens and that the first ones decode again the
    same with this temperature and seed (SBDError otherwise, nothing written). Resume rules:
    `sbd.training.distill_file`."""
    from ..decoding.generate import check_context, check_prompt_ids, encode_prompts
    from ..models.facts import default_eos_ids

    if not isinstance(batch_size, int) or batch_size < 1:
        raise SBDError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if chat and not getattr(tokenizer, "chat_template", None):
        raise SBDError("this tokenizer has no chat template; distill with chat=False (--no-chat)")
    if model_name is None:
        model_name = getattr(model.config, "name_or_path", "") or ""
    settings = _settings(model_name, chat, max_new_tokens, temperature, seed)
    sources = _as_sources(prompts)
    found = check(sources, out, model_name=model_name, chat=chat, max_new_tokens=max_new_tokens,
                  temperature=temperature, seed=seed, adopt=adopt)
    everything = [p for _, ps in sources for p in ps]
    names = [s for s, ps in sources for _ in ps]
    out = Path(out)
    if found.adopt:
        files.check_adopted(out, encode_prompts(tokenizer, everything, chat), max_new_tokens,
                            default_eos_ids(model, tokenizer))
        _check_adopted_decoding(model, tokenizer, out, max_new_tokens=max_new_tokens, temperature=temperature,
                                seed=seed)
    todo = [i for i in range(len(everything)) if i not in found.done]
    ids = dict(zip(todo, encode_prompts(tokenizer, [everything[i] for i in todo], chat))) if todo else {}
    if todo:
        check_context(model, list(ids.values()), max_new_tokens)
        check_prompt_ids(model, tokenizer, list(ids.values()))
    try:
        return _write(model, tokenizer, out, found, files.make_meta(settings, sources), todo, ids, names,
                      batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                      progress=progress, total=len(everything))
    except OSError as e:  # a read-only place, a full disk: the records already written stay intact
        where = Path(str(e.filename or out))
        if where.name.startswith(".") and where.name.endswith(".tmp"):  # a temp file stands for its target
            where = where.with_name(where.name[1:-4])
        raise SBDError(f"cannot write {where}: {e.strerror or e} (the records already in {out} are intact; fix "
                       "that and run the same command to continue)") from None


def _check_adopted_decoding(model, tokenizer, out: Path, *, max_new_tokens: int, temperature: float,
                            seed: int) -> None:
    """adopt writes a sidecar recording this run's temperature and seed as the ones the old answers were made
    with, so they must be: the first records are decoded again with them (each answer is exactly what the
    model gives that prompt alone, `decode`) and must come out the same; SBDError in one line otherwise.
    The prompts and the budget are checked before (`distill_file.check_adopted`)."""
    import json

    records = []
    with out.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                records.append((n, json.loads(raw.decode("utf-8"))))
            except (ValueError, UnicodeDecodeError):
                continue  # the torn last line (`distill_file.inspect` allows no other)
            if len(records) == ADOPT_CHECKED:
                break
    if not records:
        return
    ids = {rec["index"]: rec["prompt_ids"] for _, rec in records}
    again = dict(decode(model, tokenizer, list(ids), ids, batch_size=len(ids), max_new_tokens=max_new_tokens,
                        temperature=temperature, seed=seed))
    for n, rec in records:
        if again[rec["index"]] != rec["completion_ids"]:
            made = ("greedy (--temperature 0)" if temperature == 0 else
                    f"with --temperature {temperature:g} --seed {seed}")
            raise SBDError(f"--adopt: line {n} of {out} is not the model's answer to prompt {rec['index']} {made}: "
                           "it was made with another --temperature or --seed (or another model); give the ones it "
                           "was made with; not adopted")


def _write(model, tokenizer, out: Path, found, meta: dict, todo, ids, names, *, batch_size, max_new_tokens,
           temperature, seed, progress, total) -> int:
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    if found.keep is not None:
        files.drop_torn_end(out, found.keep)
    body = (json.dumps(meta, indent=1) + "\n").encode("utf-8")
    sidecar = files.meta_path(out)
    if not (sidecar.is_file() and sidecar.read_bytes() == body):
        files.write_atomically(sidecar, lambda f: f.write(body))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=total - len(todo), desc="sbd distill", dynamic_ncols=True)
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    written, unsynced, synced_at = 0, 0, time.monotonic()
    good = os.fstat(fd).st_size
    try:
        if found.newline:
            _write_all(fd, b"\n")
            good += 1
        for i, c_ids in decode(model, tokenizer, todo, ids, batch_size=batch_size, max_new_tokens=max_new_tokens,
                               temperature=temperature, seed=seed):
            line = json.dumps({"index": i, "source": names[i], "prompt": tokenizer.decode(ids[i]),
                               "completion": tokenizer.decode(c_ids, skip_special_tokens=True),
                               "prompt_ids": ids[i], "completion_ids": c_ids}) + "\n"
            data = line.encode("utf-8")
            try:
                _write_all(fd, data)
            except OSError:
                _truncate(fd, good)  # no half record left behind
                raise
            good += len(data)
            written += 1
            unsynced += 1
            if unsynced >= SYNC_RECORDS or time.monotonic() - synced_at >= SYNC_SECONDS:
                os.fsync(fd)
                unsynced, synced_at = 0, time.monotonic()
            if bar is not None:
                bar.update(1)
        os.fsync(fd)
    finally:
        os.close(fd)
        if bar is not None:
            bar.close()
    return written


def _truncate(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass


def decode(model, tokenizer, todo: list[int], ids: dict, *, batch_size: int, max_new_tokens: int,
           temperature: float = 0.0, seed: int = 0):
    """Yield (index, completion token ids) as answers finish, keeping `batch_size` prompts in flight: a
    finished row is replaced by the next prompt before the next step. Each answer equals
    `generate(model, tokenizer, [ids[i]], method="ntp", seed=seed + i)`'s."""
    import torch

    from ..decoding.engine import Engine
    from ..decoding.kinds import make_row
    from ..decoding.spec import DecodeSpec
    from ..models.facts import ModelFacts
    from ..modes import eval_mode

    if not todo:
        return
    facts = ModelFacts.of(model, tokenizer)
    spec = DecodeSpec.build(facts, method="ntp", max_new_tokens=max_new_tokens,
                            temperature=temperature)

    def new_row(i):
        return make_row(spec, ids[i], mask_id=None, eos=facts.eos_ids, tokenizer=tokenizer,
                        seed=seed + i if temperature > 0 else None, device=facts.device)

    first = new_row(todo[0])
    capacity = max(len(ids[i]) for i in todo) + max_new_tokens + first.needs_extra
    engine = Engine(model, min(batch_size, len(todo)), capacity, max_width=2 * facts.block_size + 1)
    engine.add(first)
    index = {id(first): todo[0]}
    waiting = iter(todo[1:])
    while True:
        with eval_mode(model), torch.inference_mode():
            while engine.live < engine.slots and (i := next(waiting, None)) is not None:
                row = new_row(i)
                engine.add(row)
                index[id(row)] = i
            if not engine.live:
                return
            done = engine.step()
        for row in done:  # outside inference mode: the caller writes records here
            yield index.pop(id(row)), list(row.out)
