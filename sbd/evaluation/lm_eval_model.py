"""The lm-evaluation-harness model `sbd`: any task of the harness decoded with NTP, SBD or SBD-verify.

`generate_until` requests go through `sbd.generate` in batches (the task's `until` strings are stop
strings, so a row stops as soon as one appears); log-likelihood requests go through the model's plain
causal forward (the NTP head, one forward per batch), as for any causal LM. Decoding cost — forwards
(NFE), generated tokens, tokens per forward and wall time — is counted per task; `stats()` returns it,
`stats_path=FILE` writes it, and `sbd lm-eval` writes it next to the harness's results file.

Model arguments (`--model_args k=v,...`): pretrained (a model folder, or demo / demo-ntp / smollm2; from
Python also a loaded model with `tokenizer=`), adapter (a drafting adapter folder to decode with instead
of the model's own), method
(ntp | sbd | sbd-verify; default sbd-verify, as `sbd.generate`), gamma, anchor (true: plain SBD anchored on the next-token head), block_size, proxy,
draft, lookup (true/false), lookup_max, tree (widths
joined by ":" as the harness splits on commas, e.g. tree=3:2, or chain), max_gen_toks, dtype, threads,
stats_path, trust_remote_code (what lm-eval's --trust_remote_code passes). Any other argument is refused
in one line (a misspelt one would decode with the default). block_size and sbd-verify's drafting settings left out are the model's defaults (an adapter's
trained block size; its measured fastest exact configuration, `sbd.decoding.defaults`), as in
`sbd.generate`.
`--batch_size` and `--device` are the harness's own options (it passes them as the arguments batch_size
and device; `--max_batch_size` goes with `--batch_size auto`, which is refused).
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from ..errors import SBDError

log = logging.getLogger(__name__)
_last = None  # the most recently built SBDLM: `sbd lm-eval` reads its counts after the harness returns
KNOWN_GEN_KWARGS = {"until", "max_gen_toks", "do_sample", "temperature", "seed"}


def _flag(name: str, value) -> bool | None:
    """A true/false model argument (the harness passes strings); None stays None (the default)."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise SBDError(f"model argument {name}={value!r} is not true or false")


def _number(name: str, value, kind):
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise SBDError(f"model argument {name}={value!r} is not a {kind.__name__}") from None


@register_model("sbd")
class SBDLM(TemplateLM):
    """lm-eval's `LM` interface over an SBD-capable (or any causal) model folder."""

    def __init__(self, pretrained: str = "demo", method: str = "sbd-verify", gamma=None, block_size=None, adapter=None,
                 anchor=None,
                 proxy: str | None = None, draft: str | None = None, lookup=None, lookup_max=None, tree=None,
                 max_gen_toks=256, batch_size=1,
                 max_batch_size=None, device: str | None = None, dtype: str | None = None, threads=None,
                 stats_path: str | None = None, trust_remote_code=None, tokenizer=None, **unknown):
        super().__init__()
        global _last
        from ..decoding.spec import METHODS, DecodeSpec
        from ..models.loading import load

        if unknown:  # a misspelt argument would otherwise decode with its default, silently
            raise SBDError(f"unknown model argument{'s' if len(unknown) > 1 else ''} {', '.join(sorted(unknown))} "
                           f"of the sbd model; it takes {', '.join(MODEL_ARGS)}")
        if str(batch_size).startswith("auto"):
            raise SBDError("--batch_size auto is not supported by the sbd model; give a number, e.g. 8")
        if max_batch_size is not None:
            raise SBDError("--max_batch_size goes with --batch_size auto, which the sbd model does not support; "
                           "give --batch_size N instead")
        self.batch_size_per_gpu = _number("batch_size", batch_size, int)
        if self.batch_size_per_gpu < 1:
            raise SBDError(f"batch_size must be >= 1, got {batch_size}")
        if method not in METHODS:
            raise SBDError(f"model argument method={method!r}: choose from {', '.join(METHODS)}")
        if threads is not None:
            torch.set_num_threads(_number("threads", threads, int))
        torch_dtype = None
        if dtype not in (None, "auto"):
            torch_dtype = getattr(torch, str(dtype), None)
            if not isinstance(torch_dtype, torch.dtype):
                raise SBDError(f"model argument dtype={dtype!r} is not a torch dtype (float32, bfloat16, ...)")
        device = str(device or "cuda")
        if device.startswith("cuda") and not torch.cuda.is_available():
            log.warning("sbd: CUDA is not available (the harness's default device is cuda); running on cpu")
            device = "cpu"
        if isinstance(pretrained, torch.nn.Module):  # Python API: an already loaded model and its tokenizer
            if adapter is not None:
                raise SBDError("adapter= goes with a model folder; attach it to a loaded model with sbd.load")
            if tokenizer is None:
                raise SBDError("pass tokenizer= along with a loaded model as pretrained=")
            self.model, self.tokenizer = pretrained.to(device).eval(), tokenizer
            self.pretrained = getattr(pretrained.config, "_name_or_path", "") or type(pretrained).__name__
        else:
            self.model, self.tokenizer = load(str(pretrained), adapter=adapter, device=device, dtype=torch_dtype,
                                              probe=method != "ntp",
                                              trust_remote_code=bool(_flag("trust_remote_code", trust_remote_code)))
            self.pretrained = str(pretrained)
        # the settings given (None: left out, the model's default); checked here, once, as one spec
        self.given = {"method": method, "anchor": _flag("anchor", anchor),
                      "gamma": None if gamma is None else _number("gamma", gamma, float), "proxy": proxy,
                      "block_size": None if block_size is None else _number("block_size", block_size, int),
                      "draft": draft, "lookup": _flag("lookup", lookup),
                      "lookup_max": None if lookup_max is None else _number("lookup_max", lookup_max, int),
                      "tree": None if tree is None else str(tree).replace(":", ",")}
        self.given = {k: v for k, v in self.given.items() if v is not None}
        self.max_gen_toks_default = _number("max_gen_toks", max_gen_toks, int)
        greedy = DecodeSpec.resolve(self.model, **self.given, max_new_tokens=self.max_gen_toks_default)
        self.method, self.anchor, self.block_size = greedy.method, greedy.anchor, greedy.block_size
        self.gamma, self.proxy = greedy.gamma, greedy.proxy
        self.reads = greedy.reads()  # what the stats name: only the settings this decoding reads
        self.settings = greedy.settings  # the last generation's (stats)
        self._device = torch.device(device)
        self.stats_path = stats_path
        self.counts = defaultdict(lambda: {"requests": 0, "tokens": 0, "nfe": 0, "seconds": 0.0})
        _last = self

    # -- what the harness asks of a model ---------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        from ..models.facts import context_limit

        return context_limit(self.model) or 2048

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.replace("/", "__")

    def chat_template(self, chat_template=False):
        return getattr(self.tokenizer, "chat_template", None)

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise SBDError(f"{self.pretrained}: its tokenizer has no chat template; drop --apply_chat_template")
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens: bool = False, **kwargs) -> list[int]:
        return self.tokenizer(string, add_special_tokens=add_special_tokens).input_ids

    # -- log-likelihood: the causal path ----------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        """(sum of log p(continuation | context), whether greedy decoding reproduces it) per request,
        from one plain causal forward per batch of requests (longest first, right-padded)."""
        from tqdm import tqdm

        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        answers = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="sbd log-likelihood")
        for start in range(0, len(order), self.batch_size_per_gpu):
            chunk = order[start:start + self.batch_size_per_gpu]
            rows = []
            for i in chunk:
                _, context, continuation = requests[i]
                if not continuation:
                    raise SBDError("a log-likelihood request has an empty continuation")
                whole = (list(context) + list(continuation))[-(self.max_length + 1):]
                rows.append((whole[:-1], min(len(continuation), len(whole) - 1)))
            width = max(len(inp) for inp, _ in rows)
            ids = torch.full((len(rows), width), self.eot_token_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for r, (inp, _) in enumerate(rows):
                ids[r, :len(inp)] = torch.tensor(inp)
                mask[r, :len(inp)] = 1
            with torch.inference_mode():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            logprobs = F.log_softmax(logits.float(), dim=-1).cpu()
            for r, (i, (inp, n)) in enumerate(zip(chunk, rows)):
                target = torch.tensor((list(requests[i][1]) + list(requests[i][2]))[-n:])
                lp = logprobs[r, len(inp) - n:len(inp)]
                answer = (float(lp.gather(-1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all()))
                answers[i] = answer
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
            bar.update(len(chunk))
        bar.close()
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        totals = []
        for request in requests:
            (string,) = request.args
            windows = [(None, *make_disjoint_window(w)) for w in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            total = sum(lp for lp, _ in self._loglikelihood_tokens(windows, disable_tqdm=True))
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            totals.append(total)
        return totals

    # -- generation: NTP, SBD or SBD-verify -------------------------------------------------------
    def _decode_options(self, gen_kwargs: dict) -> dict:
        unknown = set(gen_kwargs) - KNOWN_GEN_KWARGS
        if unknown:
            log.warning("sbd: ignoring generation options %s", ", ".join(sorted(unknown)))
        until = gen_kwargs.get("until") or []
        if isinstance(until, str):
            until = [until]
        temperature = float(gen_kwargs.get("temperature", 0.0) or 0.0)
        if not gen_kwargs.get("do_sample", temperature > 0):
            temperature = 0.0
        return dict(stop=[s for s in until if s], temperature=temperature, seed=gen_kwargs.get("seed"),
                    max_new_tokens=int(gen_kwargs.get("max_gen_toks", self.max_gen_toks_default)))

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Batches of requests with the same task and generation options, each one `sbd.generate` call."""
        from tqdm import tqdm

        from ..decoding import generate

        groups = defaultdict(list)
        for i, request in enumerate(requests):
            context, gen_kwargs = request.args
            key = (request.task_name or "", json.dumps(gen_kwargs, sort_keys=True, default=str))
            groups[key].append(i)
        texts = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc=f"sbd generate ({self.method})")
        for (task, _), members in groups.items():
            options = self._decode_options(requests[members[0]].args[1])
            for start in range(0, len(members), self.batch_size_per_gpu):
                chunk = members[start:start + self.batch_size_per_gpu]
                room = self.max_length - options["max_new_tokens"]
                if room < 1:
                    raise SBDError(f"max_gen_toks {options['max_new_tokens']} leaves no room for a prompt in the "
                                   f"model's context of {self.max_length}")
                # as lm-eval's HF model does: a context longer than the room left is cut from the left
                prompts = [self.tokenizer(requests[i].args[0]).input_ids[-room:] for i in chunk]
                t0 = time.perf_counter()
                result = generate(self.model, self.tokenizer, prompts,
                                  **self.given,
                                  **options)
                self.settings = result.settings
                count = self.counts[task]
                count["requests"] += len(chunk)
                count["tokens"] += result.num_tokens
                count["nfe"] += sum(result.nfe)
                count["seconds"] += time.perf_counter() - t0
                for i, text in zip(chunk, result.texts):
                    texts[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        bar.close()
        if self.stats_path:
            self.write_stats(self.stats_path)
        return texts

    # -- decoding cost --------------------------------------------------------------------------
    def stats(self) -> dict:
        """Decoding settings and, per task and in total: requests, generated tokens, forwards (NFE, per
        row, prefill excluded), tokens per forward, mean NFE per request, wall seconds and tokens/s.
        gamma, proxy, anchor and block_size are None where the method does not read them
        (`DecodeSpec.reads`); drafting is sbd-verify's."""
        tasks = {name: dict(c) for name, c in sorted(self.counts.items())}
        if tasks:
            tasks["all"] = {k: sum(c[k] for c in self.counts.values()) for k in ("requests", "tokens", "nfe", "seconds")}
        for c in tasks.values():
            c["tokens_per_forward"] = c["tokens"] / c["nfe"] if c["nfe"] else None
            c["nfe_per_request"] = c["nfe"] / c["requests"] if c["requests"] else None
            c["tokens_per_second"] = c["tokens"] / c["seconds"] if c["seconds"] else None
        return {"pretrained": self.pretrained, "method": self.method, "gamma": self.reads.get("gamma"),
                "anchor": self.reads.get("anchor"), "block_size": self.reads.get("block_size"),
                "proxy": self.reads.get("proxy"),
                "drafting": self.settings.as_dict() if self.settings is not None else None,
                "batch_size": self.batch_size_per_gpu, "device": str(self.device),
                "dtype": str(self.model.dtype).replace("torch.", ""), "torch_threads": torch.get_num_threads(),
                "tasks": tasks}

    def write_stats(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.stats(), indent=2) + "\n")
        return path


# the model arguments SBDLM takes (tokenizer= goes with a loaded model, from Python only); lm-eval itself adds
# batch_size, max_batch_size and device from its own options, and trust_remote_code from --trust_remote_code
MODEL_ARGS = tuple(name for name in inspect.signature(SBDLM.__init__).parameters
                   if name not in ("self", "tokenizer", "unknown"))


def last_model() -> SBDLM | None:
    """The SBDLM built most recently in this process (None before the harness has built one)."""
    return _last
