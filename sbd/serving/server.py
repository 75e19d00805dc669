"""What the endpoints share: the model, its tokenizer, the engine thread, and turning a checked request into
rows. Tokenizing and chat templates run in a small thread pool, never on the event loop, so that a long
prompt cannot hold up other requests or /health."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from ..decoding.defaults import VerifySettings
from ..decoding.generate import apply_chat, check_prompt_ids, mask_message
from ..decoding.kinds import make_row
from ..decoding.rows import verify_width
from ..decoding.spec import DecodeSpec
from ..decoding.trained_for import check_decoding
from ..decoding.width_cost import forward_costs
from ..errors import SBDError
from ..models.facts import ModelFacts
from .config import DEFAULT_MAX_TOKENS, Limits, ServerConfig
from .errors import APIError
from .metrics import Metrics
from .protocol import Options
from .worker import Job, Worker


def default_max_tokens(max_len: int, max_tokens_limit: int = 1024) -> int:
    """The max_tokens of a request that sends none: 256, or half the positions a request may use when that
    is less (the other half for its prompt), so that the default never leaves a short prompt no room."""
    return max(1, min(DEFAULT_MAX_TOKENS, max_len // 2, max_tokens_limit))


class Server:
    """The model, its tokenizer and the worker; what the endpoints share."""

    def __init__(self, model, tokenizer, config: ServerConfig):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.limits = config.limits or Limits()
        self.facts = ModelFacts.of(model, tokenizer)  # what requests are checked and decoded against
        self.default_block = self.facts.block_size
        self.mask_id = self.facts.mask_id
        limit = self.facts.context  # prompt + max_tokens never run past the model's positions
        self.max_len = min(config.max_model_len, limit) if limit else config.max_model_len
        self.max_prompt = min(config.max_prompt_tokens or self.max_len - 1, self.max_len - 1)
        if self.limits.max_tokens is None:  # left to the server: what fits this context beside a prompt
            default = default_max_tokens(self.max_len, self.limits.max_tokens_limit)
            self.limits = replace(self.limits, max_tokens=default)
        self.defaults = server_defaults(model, self.limits)
        # the widest forward a row may need: whole blocks of the largest block size a request may ask,
        # and the default drafting settings at that size (a request asking wider is refused in `jobs`)
        block = max(self.limits.block_size_limit, self.default_block)
        width = max(2 * block + 1, verify_width(block, self.defaults.lookup_max if self.defaults.lookup else 0,
                                                self.defaults.tree))
        self.width = width
        self.metrics = Metrics()
        # adaptive drafting trades acceptance against the cost of a wider step: learnt from the engine's own
        # steps (`sbd.decoding.width_cost`), kept per model shape at the engine's full batch; nothing is timed here
        self.forward_cost = forward_costs(model, batch=config.max_batch)
        # no token covers more characters than the longest vocabulary entry, so a text longer than this
        # cannot fit the prompt limit whatever the tokenizer does (x4: a normalizer may compose characters)
        longest = max((len(k) for k in tokenizer.get_vocab()), default=1) if tokenizer is not None else 1
        self.max_prompt_chars = 4 * longest * (self.max_prompt + 1)
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="sbd-tokenize")
        self.worker = Worker(model, slots=config.max_batch, capacity=self.max_len + width, max_width=width,
                             max_queue=config.max_queue, metrics=self.metrics, prefill=config.prefill,
                             step_cost=self.forward_cost)

    def count(self, path: str, status: int) -> None:
        """One answered request in the metrics (unknown paths under one label)."""
        known = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
        self.metrics.requests.labels(path if path in known else "other", str(status)).inc()

    async def _off_loop(self, fn, *args):
        """Run `fn` in the small thread pool (tokenizing, chat templates, parsing large bodies)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def check_chars(self, chars: int, param: str) -> None:
        """Refuse a text that cannot fit the prompt limit before tokenizing it."""
        if chars > self.max_prompt_chars:
            raise APIError(400, f"the prompt has {chars} characters, more than this server's {self.max_prompt} "
                                "tokens can hold", param=param, code="context_length_exceeded")

    async def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer; send token ids", param="prompt")
        self.check_chars(len(prompt), "prompt")
        return self.check_length(await self._off_loop(lambda: self.tokenizer(prompt).input_ids), "prompt")

    async def encode_chat(self, messages: list[dict]) -> list[int]:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template, so /v1/chat/completions cannot format "
                                "messages; send the text as prompt to /v1/completions", param="messages")
        self.check_chars(sum(len(m["content"]) for m in messages), "messages")
        try:
            ids = await self._off_loop(apply_chat, self.tokenizer, messages)
        except SBDError as e:
            raise APIError(400, str(e), param="messages") from None
        except Exception as e:  # a template that refuses the conversation (e.g. roles out of order)
            raise APIError(400, f"the chat template refused these messages: {e}", param="messages") from None
        if self.mask_id is not None and self.mask_id in ids:  # named by its message, before any other check
            j = await self._off_loop(mask_message, self.tokenizer, self.mask_id, messages)
            where = "messages" if j is None else f"messages[{j}].content"
            text = self.tokenizer.convert_ids_to_tokens(int(self.mask_id))
            raise APIError(400, f"{where} contains the SBD mask token {text!r}; it is reserved for decoding and "
                                "cannot appear in a message", param=where)
        return self.check_length(ids, "messages")

    def check_length(self, ids: list[int], param: str) -> list[int]:
        if len(ids) > self.max_prompt:
            raise APIError(400, f"the prompt has {len(ids)} tokens; this server takes at most {self.max_prompt}",
                           param=param, code="context_length_exceeded")
        return ids

    def jobs(self, prompt_ids: list[int], opts: Options) -> list[Job]:
        """The request's n rows (with a seed, row i samples with seed + i, as `sbd.generate` does)."""
        spec = opts.spec
        try:
            # plain SBD on a drafter not trained for it: refused, naming the request fields to send instead
            check_decoding(self.model, spec.method, anchor=spec.anchor, interface="http")
        except SBDError as e:
            raise APIError(400, str(e), param="method") from None
        if len(prompt_ids) + spec.max_new_tokens > self.max_len:
            room = self.max_len - len(prompt_ids)
            what = (f"max_tokens ({spec.max_new_tokens})" if opts.max_tokens_given else
                    f"this server's default max_tokens ({spec.max_new_tokens}; the request sent none)")
            fix = f": send max_tokens of at most {room}" if room >= 1 else ": send a shorter prompt"
            raise APIError(400, f"prompt ({len(prompt_ids)} tokens) + {what} exceeds this server's {self.max_len} "
                                f"tokens per request{fix}", param="max_tokens", code="context_length_exceeded")
        try:
            check_prompt_ids(self.model, self.tokenizer, [prompt_ids], prompt_ids)  # one prompt: "the prompt"
        except SBDError as e:
            raise APIError(400, str(e), param="prompt") from None
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        jobs = []
        for i in range(opts.n):
            seed = opts.seed + i if opts.seed is not None and spec.temperature > 0 else None
            row = make_row(spec, prompt_ids, mask_id=self.mask_id, eos=self.facts.eos_ids, tokenizer=self.tokenizer,
                           seed=seed, device=self.facts.device, cost=self.forward_cost)
            if row.needs_extra > self.width:
                raise APIError(400, f"this tree or lookup_max needs forwards {row.needs_extra} tokens wide; this "
                                    f"server runs at most {self.width}", param="tree" if spec.tree else "lookup_max")
            jobs.append(Job(row, spec.method, loop, events=events, index=i))
        return jobs


def server_defaults(model, limits: Limits) -> VerifySettings:
    """Greedy sbd-verify's drafting settings for requests that leave them out: the server's options where
    given, else the model's measured defaults (the same as `sbd.generate`'s)."""
    return DecodeSpec.resolve(model, method="sbd-verify", draft=limits.draft, lookup=limits.lookup,
                              lookup_max=limits.lookup_max, tree=limits.tree).settings
