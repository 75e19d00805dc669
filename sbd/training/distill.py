"""Self-distilled training data: the model's own completions of a prompt set (`sbd distill`).

sbd-verify accepts a draft token exactly when it is what the model itself would say, so the drafts
should learn the model's own outputs rather than reference solutions. Each record keeps the exact
token ids the model produced (`prompt_ids`, `completion_ids`: no re-tokenisation drift) next to the
text. Records are appended batch by batch with a flush, so an interrupted run loses at most one batch
and the same command continues where it stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import SBDError

def _done(out: Path) -> set[int]:
    """Indices already distilled; a torn last line (an interrupted write) is dropped from the file."""
    if not out.is_file():
        return set()
    keep, done = [], set()
    for line in out.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            done.add(int(rec["index"]))
            keep.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    out.write_text("".join(k + "\n" for k in keep), encoding="utf-8")
    return done


def distill(model, tokenizer, prompts: list, out, *, chat: bool = True, max_new_tokens: int = 256,
            batch_size: int = 8, temperature: float = 0.0, seed: int = 0, progress: bool = True) -> int:
    """Append `{"index", "prompt", "completion", "prompt_ids", "completion_ids"}` records of the model's
    own completions to `out` (jsonl), skipping prompts already there; returns how many were written."""
    from ..decoding import generate
    from ..decoding.generate import encode_prompts

    if not prompts:
        raise SBDError("no prompts to distill")
    if batch_size < 1 or max_new_tokens < 1:
        raise SBDError("batch_size and max_new_tokens must be >= 1")
    if chat and not getattr(tokenizer, "chat_template", None):
        raise SBDError("this tokenizer has no chat template; distill with chat=False (--no-chat)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _done(out)
    todo = [i for i in range(len(prompts)) if i not in done]
    written = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="sbd distill", dynamic_ncols=True)
    with out.open("a", encoding="utf-8") as f:
        for start in range(0, len(todo), batch_size):
            idx = todo[start: start + batch_size]
            ids = encode_prompts(tokenizer, [prompts[i] for i in idx], chat)
            res = generate(model, tokenizer, ids, method="ntp", max_new_tokens=max_new_tokens,
                           temperature=temperature, seed=seed + idx[0] if temperature > 0 else None)
            for i, p_ids, c_ids in zip(idx, ids, res.token_ids):
                f.write(json.dumps({"index": i, "prompt": tokenizer.decode(p_ids), "completion":
                                    tokenizer.decode(c_ids, skip_special_tokens=True), "prompt_ids": p_ids,
                                    "completion_ids": c_ids}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            written += len(idx)
            if bar is not None:
                bar.update(len(idx))
    if bar is not None:
        bar.close()
    return written
