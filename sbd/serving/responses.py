"""The response bodies the server sends, in OpenAI's shapes: completions and chat completions, whole or
as stream chunks, with their `logprobs` (each entry from the decoder: `(token_id, logprob, [(alt_id,
alt_logprob), ...])`)."""

from __future__ import annotations

import time
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _piece(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer is not None else str(token_id)


def completion_logprobs(tokenizer, entries: list, offset: int = 0) -> dict:
    """Legacy completions: tokens, their logprobs, the top alternatives (plus the chosen token) and where
    each token's text starts (`offset`: characters already sent before these tokens)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, logprob, alts in entries:
        piece = _piece(tokenizer, token)
        top: dict[str, float] = {}
        for alt, alt_logprob in list(alts) + [(token, logprob)]:
            key = _piece(tokenizer, alt)
            top[key] = max(top.get(key, -float("inf")), float(alt_logprob))
        out["tokens"].append(piece)
        out["token_logprobs"].append(float(logprob))
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(piece)
    return out


def chat_logprobs(tokenizer, entries: list) -> dict:
    """Chat completions: one `{token, logprob, bytes, top_logprobs}` per token."""
    def item(token, logprob):
        piece = _piece(tokenizer, token)
        return {"token": piece, "logprob": float(logprob), "bytes": list(piece.encode("utf-8", "replace"))}

    return {"content": [{**item(t, lp), "top_logprobs": [item(a, alp) for a, alp in alts]}
                        for t, lp, alts in entries],
            "refusal": None}


def completion_body(rid: str, model: str, choices: list[dict], use: dict, stats: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": use, "sbd": stats}


def completion_choice(index: int, text: str, reason: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "finish_reason": reason, "logprobs": logprobs}


def chat_body(rid: str, model: str, choices: list[dict], use: dict, stats: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": use, "sbd": stats}


def chat_choice(index: int, text: str, reason: str, logprobs: dict | None = None) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
            "logprobs": logprobs}


def completion_chunk(rid: str, model: str, choice: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice]}


def chat_chunk(rid: str, model: str, index: int, delta: dict, reason: str | None,
               logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": reason, "logprobs": logprobs}]}
