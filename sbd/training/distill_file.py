"""The output of `sbd distill`: a jsonl file of records and its sidecar `OUT.meta.json`.

The sidecar records the settings the answers were made with and the prompts they answer (per source:
how many, and a hash). A run on an existing output first reads both and refuses, touching nothing,
when the file is not distill's own or was made with other prompts or settings. What may change on a
resume: sources appended after the recorded ones (the recorded prompts stay a prefix), --batch-size,
--device, --threads, and --seed when greedy (temperature 0).

Every change to existing bytes is atomic (a temp file in the same folder, fsync, `os.replace`); new
records are appended, so a crash at any moment leaves the records already written intact.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SBDError

FORMAT = "sbd-distill 1"
SETTINGS = ("model", "chat", "max_new_tokens", "temperature", "seed")


def meta_path(out) -> Path:
    """The sidecar of `out`: the same name with `.meta.json` appended."""
    out = Path(out)
    return out.with_name(out.name + ".meta.json")


def prompts_hash(prompts) -> str:
    """sha256 of the prompts as given (strings or message lists), one canonical JSON line each."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps(p, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8") + b"\n")
    return h.hexdigest()


def make_meta(settings: dict, sources: list[tuple[str, list]]) -> dict:
    """The sidecar's content for these settings and (source, prompts) pairs."""
    everything = [p for _, ps in sources for p in ps]
    return {"format": FORMAT, **{k: settings[k] for k in SETTINGS},
            "sources": [{"source": s, "prompts": len(ps), "sha256": prompts_hash(ps)} for s, ps in sources],
            "prompts": len(everything), "prompts_sha256": prompts_hash(everything)}


def is_record(rec) -> bool:
    """A distill record: at least its prompt's index and the exact token ids."""
    return (isinstance(rec, dict) and isinstance(rec.get("index"), int) and not isinstance(rec["index"], bool)
            and rec["index"] >= 0 and isinstance(rec.get("prompt_ids"), list)
            and isinstance(rec.get("completion_ids"), list))


@dataclass
class Existing:
    """What a run found in --out: the prompts already answered, and how to repair a torn end."""

    done: set = field(default_factory=set)
    keep: int | None = None  # bytes to keep: a torn last line lies after them (atomic rewrite)
    newline: bool = False  # the last record lacks its newline (appended)
    adopt: bool = False  # a legacy file: its records are checked against the prompts (`check_adopted`)


def _same_model(a, b) -> bool:
    if a == b:
        return True
    pa, pb = Path(str(a)), Path(str(b))
    return pa.is_dir() and pb.is_dir() and pa.resolve() == pb.resolve()


def _read_meta(meta: Path) -> dict:
    try:
        raw = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise SBDError(f"{meta} is damaged ({getattr(e, 'strerror', None) or e}); it records what the answers "
                       "were made with: restore it or use another --out") from None
    keys = (*SETTINGS, "sources", "prompts", "prompts_sha256")
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or any(k not in raw for k in keys):
        raise SBDError(f"{meta} is not an `sbd distill` sidecar ({FORMAT}); restore it or use another --out")
    return raw


def _compare(meta: Path, before: dict, now: dict, sources: list[tuple[str, list]]) -> None:
    """SBDError naming the first difference between the recorded run and this one."""
    for k in SETTINGS:
        if k == "seed" and now["temperature"] == 0:
            continue  # greedy answers do not depend on the seed
        same = _same_model(now[k], before[k]) if k == "model" else now[k] == before[k]
        if not same:
            raise SBDError(f"{k} {now[k]!r} != {before[k]!r} recorded in {meta}; resume with the same settings "
                           "or use another --out")
    everything = [p for _, ps in sources for p in ps]
    n = before["prompts"]
    if len(everything) < n:
        raise SBDError(f"{len(everything)} prompts != {n} recorded in {meta}; resume with the same --prompts "
                       "(more sources may be appended after them) or use another --out")
    if prompts_hash(everything[:n]) == before["prompts_sha256"]:
        return
    at = 0
    for i, s in enumerate(before["sources"]):
        part = everything[at: at + s["prompts"]]
        if prompts_hash(part) != s["sha256"]:
            raise SBDError(f"prompts {at}-{at + s['prompts'] - 1} differ from those of source {i + 1} "
                           f"({s['source']!r}) recorded in {meta}; resume with the same --prompts (more "
                           "sources may be appended after them) or use another --out")
        at += s["prompts"]
    raise SBDError(f"the prompts differ from those recorded in {meta}; use the same --prompts or another --out")


def _scan(out: Path, legacy: bool) -> Existing:
    """Read every line of `out`; SBDError when one that is not the last is not a distill record."""
    found = Existing()
    good = 0  # bytes up to the end of the last whole record
    what = "`sbd distill` output"
    with out.open("rb") as f:
        first = f.read(1)
        if not first:
            return found
        if first != b"{":
            raise SBDError(f"{out} exists and is not {what}; not touching it: give another --out")
        f.seek(0)
        for n, raw in enumerate(f, 1):
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                rec = None
            last = not raw.endswith(b"\n")
            if not is_record(rec):
                # a torn last line: an interrupted append of a record (dropped on the next run)
                start = b'{"index": '
                if last and raw[:len(start)] == start[:len(raw)] and (found.done or not legacy):
                    found.keep = good
                    break
                raise SBDError(f"{out} exists and is not {what} (line {n} is not a distill record); not "
                               "touching it: give another --out")
            found.newline = last
            good += len(raw)
            if rec["index"] in found.done:
                raise SBDError(f"{out} holds two records for prompt {rec['index']} (line {n}); not touching it: "
                               "give another --out")
            found.done.add(rec["index"])
    return found


def inspect(out, settings: dict, sources: list[tuple[str, list]], adopt: bool = False) -> Existing:
    """Check --out and its sidecar against this run, writing nothing; SBDError in one line when they
    do not belong to it (another file, other prompts or settings)."""
    out = Path(out)
    try:
        if out.is_dir():
            raise SBDError(f"--out {out} is a folder; give a file name (records go in FILE.jsonl)")
        meta = meta_path(out)
        if out.parent.exists() and not out.parent.is_dir():
            raise SBDError(f"--out {out}: {out.parent} is a file, not a folder")
        if out.parent.is_dir() and not os.access(out.parent, os.W_OK):
            raise SBDError(f"cannot write {out}: permission denied for the folder {out.parent}")
        if not out.exists():
            return Existing()
        if not out.is_file():
            raise SBDError(f"--out {out} is not a regular file; give a file name (records go in FILE.jsonl)")
        has_meta = meta.is_file()
        if not has_meta and out.stat().st_size == 0:
            return Existing()  # an empty file holds nothing to lose
        found = _scan(out, legacy=not has_meta)
    except OSError as e:
        raise SBDError(f"cannot read {out}: {e.strerror or e}") from None
    if not has_meta:
        if not adopt:
            raise SBDError(f"{out} holds distill records but no {meta.name} (an older sbd wrote it): add --adopt "
                           "to check them against these prompts and continue, or give another --out")
        found.adopt = True
        return found
    before = _read_meta(meta)
    _compare(meta, before, settings, sources)
    outside = [i for i in found.done if i >= before["prompts"]]
    if outside:
        raise SBDError(f"{out} has a record for prompt {min(outside)} but {meta.name} records "
                       f"{before['prompts']} prompts; not touching it: give another --out")
    return found


def check_adopted(out: Path, encoded: list[list[int]], max_new_tokens: int, eos=()) -> None:
    """A legacy file may be adopted only when every record answers the prompt at its index and fits this
    run's budget: no answer longer than --max-new-tokens, and none cut short before it (an answer that
    stops without an end-of-sequence token was cut by the budget it was made with, so a shorter one means
    another --max-new-tokens, and the sidecar would then record a setting the answers were not made with)."""
    eos = set(eos)
    with Path(out).open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                continue  # the torn last line (`inspect` allows no other)
            i = rec["index"]
            if i >= len(encoded):
                raise SBDError(f"--adopt: line {n} of {out} answers prompt {i}, but there are {len(encoded)} "
                               "prompts; not adopted")
            if rec["prompt_ids"] != encoded[i]:
                raise SBDError(f"--adopt: line {n} of {out} answers another prompt than prompt {i} of these "
                               "--prompts (or was made with the other --chat setting); not adopted")
            got = rec["completion_ids"]
            if len(got) > max_new_tokens:
                raise SBDError(f"--adopt: line {n} of {out} has {len(got)} completion tokens, "
                               f"more than --max-new-tokens {max_new_tokens}; not adopted")
            if eos and len(got) < max_new_tokens and not (got and got[-1] in eos):
                raise SBDError(f"--adopt: line {n} of {out} stops after {len(got)} tokens without an end of "
                               f"sequence, so it was made with --max-new-tokens {len(got)}, not {max_new_tokens}; "
                               "not adopted")


def write_atomically(path: Path, write) -> None:
    """Replace `path` by what `write(file)` writes: a temp file in the same folder, fsync, os.replace,
    so a crash leaves either the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        _replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    sync_folder(path.parent)


def _replace(src, dst) -> None:
    os.replace(src, dst)


def sync_folder(folder: Path) -> None:
    """fsync a folder, so that a rename or a new file in it survives a power loss (where possible)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def drop_torn_end(out: Path, keep: int) -> None:
    """Rewrite `out` with its first `keep` bytes (everything before a torn last line), atomically."""
    def copy(dst):
        with out.open("rb") as src:
            left = keep
            while left:
                chunk = src.read(min(left, 1 << 20))
                if not chunk:
                    raise OSError(errno.EIO, f"{out} shrank while it was being rewritten")
                dst.write(chunk)
                left -= len(chunk)
    write_atomically(out, copy)
