"""Carry the campaign's distilled answers across machines: `pack` writes the working `sbd distill` output
as compressed shards of token ids into benchmarks/smollm2/data/campaign/ (what gets committed);
`unpack` rebuilds the working output and its sidecar from them, so `sbd distill` resumes on a new machine.

    python benchmarks/smollm2/campaign/pack.py pack   [--work runs/campaign]
    python benchmarks/smollm2/campaign/pack.py unpack [--work runs/campaign]

A shard holds the records whose prompt index falls in its range (SHARD prompts), sorted by index, each
`{"index", "source", "prompt_ids", "completion_ids"}` (+ `"by"` and `"checked"` for the answers that
distill_vllm.py made); the sources come from the prompt file. Only shards whose content changed are rewritten.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data" / "campaign"
SHARD = 2000


def _sources(work: Path) -> list[str]:
    with (work / "prompts.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line)["source"] for line in f]


def _by(rec: dict) -> dict:
    """What made the answer when it was not `sbd distill`, and its check (distill_vllm.py)."""
    return {k: rec[k] for k in ("by", "checked") if k in rec}


def pack(work: Path) -> None:
    sources = _sources(work)
    shards: dict[int, list[dict]] = {}
    with (work / "distill.jsonl").open(encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:  # a torn last line: the next distill run drops it
                continue
            i = rec["index"]
            shards.setdefault(i // SHARD, []).append({"index": i, "source": sources[i], "prompt_ids": rec["prompt_ids"],
                                                      "completion_ids": rec["completion_ids"], **_by(rec)})
    DATA.mkdir(parents=True, exist_ok=True)
    total = 0
    for k, recs in sorted(shards.items()):
        recs.sort(key=lambda r: r["index"])
        total += len(recs)
        path = DATA / f"shard-{k:03d}.jsonl.gz"
        body = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs).encode("utf-8")
        if path.is_file() and gzip.decompress(path.read_bytes()) == body:
            continue
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(gzip.compress(body, compresslevel=9, mtime=0))
        tmp.replace(path)
    shutil.copyfile(work / "distill.jsonl.meta.json", DATA / "distill.jsonl.meta.json")
    print(f"packed {total} answers into {len(shards)} shards under {DATA}")


def unpack(work: Path) -> None:
    import sbd

    out = work / "distill.jsonl"
    if out.exists():
        raise SystemExit(f"{out} exists; unpack only rebuilds a missing working file")
    meta = json.loads((DATA / "distill.jsonl.meta.json").read_text(encoding="utf-8"))
    (given,) = [s["source"] for s in meta["sources"]]  # the --prompts source distill recorded
    _, tokenizer = sbd.load("smollm2")
    work.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for path in sorted(DATA.glob("shard-*.jsonl.gz")):
            for line in gzip.decompress(path.read_bytes()).decode("utf-8").splitlines():
                r = json.loads(line)
                f.write(json.dumps({"index": r["index"], "source": given, "prompt": tokenizer.decode(r["prompt_ids"]),
                                    "completion": tokenizer.decode(r["completion_ids"], skip_special_tokens=True),
                                    "prompt_ids": r["prompt_ids"], "completion_ids": r["completion_ids"], **_by(r)}) + "\n")
                n += 1
    tmp.replace(out)
    shutil.copyfile(DATA / "distill.jsonl.meta.json", work / "distill.jsonl.meta.json")
    print(f"rebuilt {out} with {n} answers")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["pack", "unpack"])
    ap.add_argument("--work", default="runs/campaign", help="the campaign's working folder (default runs/campaign)")
    args = ap.parse_args(argv)
    (pack if args.action == "pack" else unpack)(Path(args.work))


if __name__ == "__main__":
    main()
