"""What the vLLM proposer counts and traces: per-step draft statistics (written to `$SBD_VLLM_STATS` for
benchmarks and tests) and, with `$SBD_VLLM_TRACE`, one JSON line per request and step."""

from __future__ import annotations

import json
import time


def fresh() -> dict:
    return {"steps": 0, "tokens": 0, "lookup_drafts": 0, "mask_drafts": 0, "chain_tokens": 0, "empty_drafts": 0,
            "plain_engine_steps": 0, "engine_steps": 0, "logits_fallback": 0, "head_chains": 0}


def count_drafts(stats: dict, drafts, sampled_token_ids, mask_id: int) -> None:
    """One engine step's drafts in `stats`."""
    for d, sampled in zip(drafts, sampled_token_ids):
        if not sampled:
            continue
        stats["empty_drafts"] += not d
        if d and d[-1] == mask_id:
            stats["mask_drafts"] += 1
            stats["chain_tokens"] += d.index(mask_id)
        elif d:
            stats["lookup_drafts"] += 1
    stats["engine_steps"] += 1
    stats["plain_engine_steps"] += not any(drafts)


def trace(path: str, req_id, sampled, context, draft) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"req": req_id, "t": time.perf_counter(), "sampled": list(sampled),
                            "context": list(map(int, context)), "draft": draft}) + "\n")


def write(path: str, stats: dict) -> None:
    with open(path, "w") as f:
        json.dump(stats, f)
