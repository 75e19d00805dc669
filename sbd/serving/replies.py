"""A request's answer from its n rows: one JSON body when they are done, or server-sent events as their
tokens become final. Streaming holds back text that could be the start of a stop string or an unfinished
character, so that the concatenated stream equals the whole answer; each chunk carries the logprobs of
the tokens that arrived since the last one."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from . import responses as R
from .errors import APIError
from .protocol import Options
from .server import Server
from .worker import Job


def cut_at_stop(tokenizer, tokens: list[int], stop: list[str]) -> tuple[str, bool]:
    """The text of `tokens` cut before the first stop string, and whether one was found."""
    if tokenizer is None:
        return "", False
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    cut = [text.index(s) for s in stop if s in text]
    return (text[: min(cut)], True) if cut else (text, False)


def text_tokens(tokenizer, tokens: list[int], text: str, eos=frozenset(), least: int = 0) -> int:
    """How many leading `tokens` the answer's `text` is made of (at least `least`): the fewest whose text
    still begins with all of it. An end token stripped from the text, or a token that only completed a
    stop string cut from it, is not one of them, so logprobs cover exactly the returned text's tokens.
    Without a tokenizer (no text), every token but a final end token."""
    n = len(tokens)
    if tokenizer is None:
        return n - 1 if n > least and tokens[-1] in eos else n
    while n > least and tokenizer.decode(tokens[:n - 1], skip_special_tokens=True).startswith(text):
        n -= 1  # from the end: one or two decodes for the usual end token or stop string
    return n


def safe_prefix(text: str, stop: list[str]) -> str:
    """The part of `text` that can be sent now: not an unfinished character, nor the start of a stop string."""
    hold = max((len(s) - 1 for s in stop), default=0)
    for n in range(min(hold, len(text)), 0, -1):  # the longest tail that begins some stop string
        if any(s.startswith(text[-n:]) for s in stop):
            text = text[:-n]
            break
    return text.rstrip("\ufffd")


def stats(jobs: list[Job], opts: Options) -> dict:
    """What the request cost: sbd's own field next to OpenAI's usage."""
    tokens, nfe = sum(len(j.row.out) for j in jobs), sum(j.row.nfe for j in jobs)
    return {"method": opts.spec.method, "forwards": nfe, "tokens_per_forward": round(tokens / nfe, 4) if nfe else 0.0}


async def events(request: Request, jobs: list[Job]):
    """(index, kind, payload) until every row is done, or one fails; stops early when the client leaves."""
    queue, left = jobs[0].events, len(jobs)
    while left:
        try:
            index, kind, payload = await asyncio.wait_for(queue.get(), timeout=0.5)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return
            continue
        yield index, kind, payload
        if kind == "error":
            return
        left -= kind == "done"


async def answer(server: Server, request: Request, path: str, ids: list[int], opts: Options, chat: bool,
                 echo: str = ""):
    jobs = server.jobs(ids, opts)
    server.worker.submit(*jobs)
    rid = R.new_id("chatcmpl" if chat else "cmpl")
    if opts.stream:
        server.count(path, 200)
        return StreamingResponse(_stream(server, request, jobs, rid, opts, chat, echo), media_type="text/event-stream")
    try:
        async for _, kind, payload in events(request, jobs):
            if kind == "error":
                raise APIError(500, payload, type_="server_error")
    finally:
        for job in jobs:
            if not job.row.finished:  # the client went away, or an error: free the rows
                server.worker.cancel(job)
    if not all(job.row.finished for job in jobs):
        return JSONResponse({}, status_code=499)  # nobody is listening
    tok, name = server.tokenizer, server.config.model_name
    choices = []
    for job in jobs:
        row, text = job.row, cut_at_stop(tok, job.row.out, opts.spec.stop)[0]
        lp = None
        if opts.spec.processing.logprobs is not None:  # the tokens of the text returned, no more
            entries = row.logprobs[:text_tokens(tok, row.out, text, row.eos)]
            lp = R.chat_logprobs(tok, entries) if chat else R.completion_logprobs(tok, entries, len(echo))
        if chat:
            choices.append(R.chat_choice(job.index, text, row.finish_reason, lp))
        else:
            choices.append(R.completion_choice(job.index, echo + text, row.finish_reason, lp))
    use = R.usage(len(ids), sum(len(j.row.out) for j in jobs))
    server.count(path, 200)
    return JSONResponse((R.chat_body if chat else R.completion_body)(rid, name, choices, use, stats(jobs, opts)))


def _event(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _stream(server: Server, request: Request, jobs: list[Job], rid: str, opts: Options, chat: bool,
                  echo: str):
    tok, name = server.tokenizer, server.config.model_name
    tokens = [[] for _ in jobs]
    sent = [""] * len(jobs)
    shown = [0] * len(jobs)  # tokens whose logprobs went out
    offset = [len(echo)] * len(jobs)  # where the next shown token's text starts (completions' text_offset)

    def chunk(i: int, text: str, reason: str | None = None, final: bool = False) -> dict:
        """A chunk for choice i with `text` and the logprobs of the tokens that make up the text sent so far
        (with this chunk) and were not shown yet."""
        lp = None
        if opts.spec.processing.logprobs is not None:
            row = jobs[i].row
            made = row.out if final else tokens[i]
            upto = min(text_tokens(tok, made, sent[i] + text, row.eos, shown[i]), len(row.logprobs))
            new, shown[i] = row.logprobs[shown[i]:upto], max(shown[i], upto)
            lp = R.chat_logprobs(tok, new) if chat else R.completion_logprobs(tok, new, offset[i])
            if not chat:
                offset[i] += sum(len(piece) for piece in lp["tokens"])
        if chat:
            return R.chat_chunk(rid, name, i, {"content": text} if text or reason is None else {}, reason, lp)
        return R.completion_chunk(rid, name, R.completion_choice(i, text, reason, lp))

    try:
        for i in range(len(jobs)):
            if chat:
                yield _event(R.chat_chunk(rid, name, i, {"role": "assistant", "content": ""}, None))
            elif echo:
                yield _event(R.completion_chunk(rid, name, R.completion_choice(i, echo, None)))
        finished = 0
        async for i, kind, payload in events(request, jobs):
            if kind == "error":
                yield _event(APIError(500, payload, type_="server_error").body())
                return
            if kind == "tokens":
                tokens[i] += payload
                text, found = cut_at_stop(tok, tokens[i], opts.spec.stop)
                ready = text if found else safe_prefix(text, opts.spec.stop)
                if len(ready) > len(sent[i]) and ready.startswith(sent[i]):
                    out = chunk(i, ready[len(sent[i]):])
                    sent[i] = ready
                    yield _event(out)
                continue
            finished += 1
            row = jobs[i].row
            text, _ = cut_at_stop(tok, row.out, opts.spec.stop)
            rest = text[len(sent[i]):] if len(text) > len(sent[i]) and text.startswith(sent[i]) else ""
            last = chunk(i, rest, row.finish_reason, final=True)
            if finished == len(jobs):  # usage and sbd's costs on the very last chunk
                last["usage"] = R.usage(len(row.prompt), sum(len(j.row.out) for j in jobs))
                last["sbd"] = stats(jobs, opts)
            yield _event(last)
        if finished == len(jobs):
            yield "data: [DONE]\n\n"
    except asyncio.CancelledError:  # the client disconnected mid-stream: free its rows
        for job in jobs:
            server.worker.cancel(job)
        raise
    finally:
        for job in jobs:
            if not job.row.finished:
                server.worker.cancel(job)
