#!/usr/bin/env python
"""Robustness probes of sbd serve, distill, train and generate, re-run end to end as a script, each
outcome counted.

What it does: starts real `sbd serve` subprocesses on free ports (the demo model, `--threads 1`), drives them
with the official `openai` client and `httpx`, runs `sbd distill`, `sbd train` and `sbd generate` in temp
folders, and classifies every probe as one of

  OK            the required behaviour
  silent-wrong  an answer or status that is wrong without saying so (wrong text with HTTP 200, a parameter
                accepted and ignored, a 4xx that is not OpenAI's error shape, a 500 for a client mistake,
                a slow /health, memory that does not come back, more than one line for a CLI mistake, ...)
  traceback     "Traceback (most recent call last)" on stderr, or a 500 whose body is not OpenAI's shape
  data-loss     a file the user had is changed or loses records
  hang          a timeout (a request, a process that does not exit)
  crash         a process ended by a signal (or rc 134, C++'s abort), a server gone during a probe

The probes are written against the REQUIRED behaviour, not against what the code does today: a feature that
is not built comes out non-OK. Groups:

  1 cross-request contamination    2 OpenAI parameters honoured or refused   3 big requests
  4 client mistakes are 4xx        5 Ctrl-C                                   6 API key
  7 sbd distill never loses data   8 sbd train --adapter lora                9 minor (error shape, chat parts, busy port)

Run from the repository root:

    python benchmarks/probes/probes.py            # every probe (< 10 minutes on 2 shared cores)
    python benchmarks/probes/probes.py --quick    # a small subset

Writes benchmarks/probes/results/probes.md and probes.json (--out to change the folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parents[2]
SBD = str(Path(sys.executable).with_name("sbd"))
OUTCOMES = ("OK", "silent-wrong", "traceback", "data-loss", "hang", "crash")
GROUPS = {
    1: "cross-request contamination (concurrent clients, early closes)",
    2: "OpenAI parameters honoured or refused (400 naming it)",
    3: "big requests (10 MB prompts, /health, 413, prompt-token limit, memory)",
    4: "client mistakes are 4xx, never 500 / traceback",
    5: "Ctrl-C with requests in flight",
    6: "API key (--api-key, SBD_API_KEY)",
    7: "sbd distill never loses data",
    8: "sbd train --adapter lora (rank check, base recorded)",
    9: "minor: error shape, chat text parts, busy port",
}
TRACEBACK = "Traceback (most recent call last)"
KEY = "sk-probe-7f3a"
REQ_TIMEOUT = 45.0
ADD = "Add up: {} + {} - {} + {}\n"


@dataclass
class Result:
    group: int
    name: str
    outcome: str
    detail: str
    seconds: float


class Recorder:
    def __init__(self):
        self.results: list[Result] = []
        self.lock = threading.Lock()

    def add(self, group: int, name: str, outcome: str, detail: str, seconds: float = 0.0) -> None:
        assert outcome in OUTCOMES, outcome
        with self.lock:
            self.results.append(Result(group, name, outcome, detail[:600], round(seconds, 3)))
        mark = "  " if outcome == "OK" else "!!"
        print(f"{mark} [{group}] {name}: {outcome}" + ("" if outcome == "OK" else f" -- {detail[:200]}"), flush=True)


REC = Recorder()


# ----------------------------------------------------------------------------------------------------- helpers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openai_shaped(body) -> bool:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    return (isinstance(body, dict) and isinstance(body.get("error"), dict)
            and {"message", "type", "param", "code"} <= set(body["error"]) and isinstance(body["error"]["message"], str))


def names(body, param: str) -> bool:
    """The error names `param` (in `param`, else in the message)."""
    if not openai_shaped(body):
        return False
    e = body["error"]
    return param in str(e.get("param") or "") or param in e["message"]


def jbody(resp: httpx.Response):
    try:
        return resp.json()
    except Exception:
        return resp.text[:300]


def one_line_error(err: str) -> bool:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return len(lines) == 1 and lines[0].startswith("sbd: error")


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cli_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    env.pop("SBD_API_KEY", None)
    return env


def run_cli(args: list[str], cwd: Path, timeout: float = 180) -> tuple[int | None, str, str, float]:
    """(rc or None on timeout, stdout, stderr, seconds)."""
    t = time.monotonic()
    try:
        p = subprocess.run(args, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.monotonic() - t
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""), \
            time.monotonic() - t


def cli_outcome(rc, err: str) -> tuple[str, str] | None:
    """The outcome when a CLI run hung, crashed or printed a traceback; None when it did none of these."""
    if rc is None:
        return "hang", "timed out"
    if rc < 0 or rc in (134, 137, 139):
        return "crash", f"rc {rc}"
    if TRACEBACK in err:
        return "traceback", err.strip().splitlines()[-1][:200]
    return None


# ------------------------------------------------------------------------------------------------------ server

class Server:
    """One `sbd serve` subprocess; its stderr goes to a file read after every probe."""

    def __init__(self, name: str, work: Path, args: list[str], model: str = "demo", env: dict | None = None,
                 host: str = "127.0.0.1"):
        self.name, self.port, self.host = name, free_port(), host
        self.cmd = [SBD, "serve", "--model", model, "--threads", "1", "--host", host, "--port", str(self.port), *args]
        self.out_path, self.err_path = work / f"{name}.out", work / f"{name}.err"
        e = cli_env()
        e.update(env or {})
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.out_path, "wb"), stderr=open(self.err_path, "wb"),
                                     cwd=work, env=e)
        self.base = f"http://127.0.0.1:{self.port}"
        self.pos = 0
        self.http = httpx.Client(base_url=self.base, timeout=REQ_TIMEOUT)
        self.ready_s = None

    def wait_ready(self, timeout: float = 240) -> bool:
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    self.ready_s = time.monotonic() - t
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        return False

    def stderr_all(self) -> str:
        return self.err_path.read_bytes().decode(errors="replace")

    def stdout_all(self) -> str:
        return self.out_path.read_bytes().decode(errors="replace")

    def new_stderr(self) -> str:
        data = self.err_path.read_bytes()
        new, self.pos = data[self.pos:], len(data)
        return new.decode(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def post(self, path: str, body=None, headers: dict | None = None, content: bytes | None = None,
             timeout: float = REQ_TIMEOUT) -> httpx.Response:
        h = {"authorization": f"Bearer {KEY}"} if self.needs_key else {}
        h.update(headers or {})
        if content is not None:
            h.setdefault("content-type", "application/json")
            return self.http.post(path, content=content, headers=h, timeout=timeout)
        return self.http.post(path, json=body, headers=h, timeout=timeout)

    needs_key = False

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.http.close()


def server_probe(srv: Server, group: int, name: str, fn) -> None:
    """Run `fn() -> (outcome, detail)` against `srv`; a traceback on its stderr, a timeout or the server's death
    overrides what `fn` said."""
    t = time.monotonic()
    srv.new_stderr()
    try:
        outcome, detail = fn()
    except (httpx.TimeoutException, asyncio.TimeoutError, openai.APITimeoutError) as e:
        outcome, detail = "hang", f"timed out: {type(e).__name__}"
    except (httpx.TransportError, openai.APIConnectionError) as e:
        outcome, detail = ("silent-wrong", f"connection dropped without an answer: {type(e).__name__}: {e}")
    except Exception as e:  # a bug of this script: said loudly, counted as not OK
        outcome, detail = "silent-wrong", f"probe error {type(e).__name__}: {e}"
    time.sleep(0.05)
    err = srv.new_stderr()
    if not srv.alive():
        outcome, detail = "crash", f"server {srv.name} exited rc {srv.proc.returncode} during the probe; {detail}"
    elif TRACEBACK in err:
        last = [ln for ln in err.strip().splitlines() if ln.strip()][-1:]
        outcome, detail = "traceback", f"stderr traceback ({last[0][:160] if last else ''}); {detail}"
    REC.add(group, name, outcome, detail, time.monotonic() - t)


def expect_refusal(resp: httpx.Response, param: str | None, status: tuple[int, ...] = (400,)) -> tuple[str, str]:
    """A client mistake: a 4xx (`status`) in OpenAI's shape naming `param`."""
    body = jbody(resp)
    if resp.status_code >= 500:
        if not openai_shaped(body):
            return "traceback", f"{resp.status_code} not in OpenAI's shape: {str(body)[:200]}"
        return "silent-wrong", f"{resp.status_code} for a client mistake: {body['error']['message'][:200]}"
    if resp.status_code not in status:
        return "silent-wrong", f"HTTP {resp.status_code} (expected {status}): {str(body)[:200]}"
    if not openai_shaped(body):
        return "silent-wrong", f"{resp.status_code} body not in OpenAI's shape: {str(body)[:200]}"
    if param is not None and not names(body, param):
        return "silent-wrong", f"{resp.status_code} does not name {param!r}: {body['error']}"
    return "OK", f"{resp.status_code} {body['error'].get('param')}: {body['error']['message'][:150]}"


# ----------------------------------------------------------------------------------------------------- offline

class Offline:
    """sbd.generate in this process, the reference every answer is compared with."""

    def __init__(self, chat_folder: Path):
        self.chat_folder = chat_folder
        self.ready = threading.Event()
        self.cache: dict = {}
        self.lock = threading.Lock()
        self.error = None

    def load(self) -> None:
        try:
            import torch

            import sbd

            torch.set_num_threads(1)
            self.sbd = sbd
            self.model, self.tok = sbd.load("demo")
            self.chat_model, self.chat_tok = sbd.load(str(self.chat_folder))
        except Exception as e:  # pragma: no cover
            self.error = e
        self.ready.set()

    def gen(self, prompt, chat: bool = False, **kw):
        """One prompt alone: (text, token ids, logprobs) or raises the library's SBDError."""
        self.ready.wait()
        if self.error:
            raise self.error
        key = json.dumps([prompt, chat, kw], sort_keys=True, default=str)
        with self.lock:
            if key not in self.cache:
                model, tok = (self.chat_model, self.chat_tok) if chat else (self.model, self.tok)
                try:
                    out = self.sbd.generate(model, tok, [prompt] if isinstance(prompt, str) else prompt, chat=chat,
                                            **kw)
                    self.cache[key] = (out.texts[0], out.token_ids[0], out.logprobs[0] if out.logprobs else None)
                except Exception as e:
                    self.cache[key] = e
            value = self.cache[key]
        if isinstance(value, Exception):
            raise value
        return value


    def reference(self, prompt: str, max_new: int, logit_bias: dict | None = None, presence_penalty: float = 0.0,
                  frequency_penalty: float = 0.0) -> str:
        """Greedy next-token decoding written out here (full forwards, no cache, no sbd code but the loaded
        model): OpenAI's processors applied by hand, an independent check that the server honours them."""
        import collections

        import torch

        from sbd.models.facts import default_eos_ids

        self.ready.wait()
        eos = set(default_eos_ids(self.model, self.tok))
        ids, out = self.tok(prompt).input_ids, []
        with self.lock, torch.inference_mode():
            self.model.eval()
            for _ in range(max_new):
                logits = self.model(torch.tensor([ids + out])).logits[0, -1].float().clone()
                for t, b in (logit_bias or {}).items():
                    logits[t] += b
                for t, c in collections.Counter(out).items():
                    logits[t] -= presence_penalty + frequency_penalty * c
                nxt = int(logits.argmax())
                if nxt in eos:
                    break
                out.append(nxt)
        return self.tok.decode(out, skip_special_tokens=True)


def make_chat_model(work: Path) -> Path:
    """A copy of the demo model whose tokenizer has a chat template (the shipped one has none)."""
    import sbd

    src = Path(sbd.__file__).parent / "demo_model" / "sbd"
    dst = work / "demo-chat"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return dst


# ------------------------------------------------------------------------------------------- group 1: contamination

def contamination(srv: Server, off: Offline, rounds: list[int], seed: int = 26) -> None:
    """`clients` concurrent requests per round, mixed settings; a third of the streaming ones close early.
    Every completed answer must equal offline sbd.generate; a closed stream's text must be a prefix of it."""
    rng = random.Random(seed)
    settings = [
        dict(), dict(method="ntp"), dict(block_size=4), dict(method="sbd", gamma=0.5), dict(stop=["\n"]),
        dict(temperature=0.9, seed=11), dict(temperature=0.7, seed=5, method="ntp"), dict(lookup=True),
        dict(draft="block", block_size=8), dict(presence_penalty=1.0),
    ]

    def offline_kwargs(s: dict, max_tokens: int) -> dict:
        kw = dict(method=s.get("method", "sbd-verify"), max_new_tokens=max_tokens)
        for k in ("block_size", "gamma", "stop", "temperature", "seed", "lookup", "presence_penalty"):
            if k in s:
                kw[k] = s[k]
        if kw["method"] == "sbd-verify":
            kw["draft"] = s.get("draft", "block")
        return kw

    async def one(client, i: int, prompt: str, s: dict, stream: bool, close_after: int | None, max_tokens: int):
        extra = {k: v for k, v in s.items() if k not in ("temperature", "seed", "stop", "presence_penalty")}
        kw = dict(model="demo", prompt=prompt, max_tokens=max_tokens, extra_body=extra or None)
        for k in ("temperature", "seed", "stop", "presence_penalty"):
            if k in s:
                kw[k] = s[k]
        t = time.monotonic()
        try:
            if not stream:
                r = await client.completions.create(**kw)
                return ("done", r.choices[0].text, time.monotonic() - t)
            got, k = "", 0
            st = await client.completions.create(stream=True, **kw)
            async for chunk in st:
                if chunk.choices:
                    got += chunk.choices[0].text or ""
                    k += 1
                if close_after is not None and k >= close_after:
                    await st.close()
                    return ("closed", got, time.monotonic() - t)
            return ("done", got, time.monotonic() - t)
        except openai.APIStatusError as e:
            return ("status", f"HTTP {e.status_code}: {str(e.body)[:200]}", time.monotonic() - t)
        except (openai.APITimeoutError, asyncio.TimeoutError):
            return ("hang", "", time.monotonic() - t)
        except Exception as e:
            return ("error", f"{type(e).__name__}: {e}", time.monotonic() - t)

    for rnd, clients in enumerate(rounds):
        plan = []
        for i in range(clients):
            nums = [rng.randint(1, 99) for _ in range(4)]
            s = settings[i % len(settings)]
            stream = i % 2 == 1
            close_after = rng.randint(1, 3) if stream and (i // 2) % 3 == 0 else None
            plan.append((ADD.format(*nums), s, stream, close_after, rng.choice([16, 24, 32])))

        async def run_round():
            client = openai.AsyncOpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0,
                                        timeout=REQ_TIMEOUT, http_client=None)
            try:
                return await asyncio.gather(*(one(client, i, *p) for i, p in enumerate(plan)))
            finally:
                await client.close()

        srv.new_stderr()
        t0 = time.monotonic()
        got = asyncio.run(run_round())
        wall = time.monotonic() - t0
        err = srv.new_stderr()
        alive = srv.alive()
        for i, ((prompt, s, stream, close_after, mt), (kind, text, secs)) in enumerate(zip(plan, got)):
            what = ("stream" if stream else "plain") + (f"-close{close_after}" if close_after else "")
            label = ",".join(f"{k}={v}" for k, v in s.items()) or "default"
            name = f"r{rnd + 1}x{clients} c{i:02d} {what} {label}"
            if not alive:
                REC.add(1, name, "crash", f"server exited rc {srv.proc.returncode}", secs)
                continue
            if kind == "hang":
                REC.add(1, name, "hang", "timed out", secs)
                continue
            if kind in ("status", "error"):
                REC.add(1, name, "silent-wrong", f"no answer for a valid request: {text}", secs)
                continue
            try:
                ref = off.gen(prompt, **offline_kwargs(s, mt))[0]
            except Exception as e:
                REC.add(1, name, "silent-wrong", f"offline refused the settings ({e}) but the server answered", secs)
                continue
            if kind == "closed":
                ok = ref.startswith(text)
                REC.add(1, name, "OK" if ok else "silent-wrong",
                        f"closed after {close_after} chunks; got {text!r} {'is' if ok else 'is NOT'} a prefix of "
                        f"offline {ref!r}", secs)
            else:
                ok = text == ref
                REC.add(1, name, "OK" if ok else "silent-wrong",
                        "equals offline" if ok else f"HTTP 200 {text!r} != offline {ref!r}", secs)
        if TRACEBACK in err:
            REC.add(1, f"r{rnd + 1}x{clients} server stderr", "traceback", err.strip().splitlines()[-1][:200], wall)

        def freed():
            deadline = time.monotonic() + 15
            h = {}
            while time.monotonic() < deadline:
                h = srv.http.get("/health", timeout=5).json()
                if h.get("running") == 0 and h.get("queued") == 0:
                    return "OK", f"rows free after the round ({wall:.1f} s for {clients} clients): {h}"
                time.sleep(0.3)
            return "silent-wrong", f"rows still held 15 s after the round: {h}"

        server_probe(srv, 1, f"r{rnd + 1}x{clients} rows freed after early closes", freed)


# ---------------------------------------------------------------------------------------- group 2: parameters

def params(srv: Server, chat_srv: Server, off: Offline, quick: bool) -> None:
    P = "Add up: 12 + 7 - 3 + 45\n"
    MT = 16
    base_kw = dict(method="sbd-verify", max_new_tokens=MT)

    def comp(body: dict, s: Server = srv) -> httpx.Response:
        return s.post("/v1/completions", dict(dict(model="demo", prompt=P, max_tokens=MT), **body))

    def honoured_or_refused(param: str, body: dict, check, endpoint: str = "completions", s: Server | None = None):
        """200: `check(json) -> (ok, detail)` says whether it was honoured; 400 naming `param`: refused."""
        def fn():
            if endpoint == "completions":
                r = comp(body, s or srv)
            else:
                cs = s or chat_srv
                merged = dict(dict(model=CHAT_NAME, messages=[{"role": "user", "content": P}], max_tokens=MT), **body)
                r = cs.post("/v1/chat/completions", {k: v for k, v in merged.items() if v is not None})
            if r.status_code == 200:
                ok, detail = check(r.json())
                return ("OK" if ok else "silent-wrong"), ("honoured: " if ok else "accepted, not honoured: ") + detail
            return expect_refusal(r, param)
        return fn

    def equals_offline(prompt=P, **kw):
        def check(j):
            text = j["choices"][0]["text"] if "text" in j["choices"][0] else j["choices"][0]["message"]["content"]
            try:
                ref = off.gen(prompt, **dict(base_kw, **kw))[0]
            except Exception as e:
                return False, f"offline sbd.generate refuses {kw} ({e}), the server answered {text!r}"
            return text == ref, f"{text!r} {'==' if text == ref else '!='} offline {ref!r}"
        return check

    def equals_both(prompt=P, **kw):
        """Equal to offline sbd.generate AND to the hand-written reference loop (so a processor ignored by
        both the server and the library is caught)."""
        def check(j):
            ok, detail = equals_offline(prompt, **kw)(j)
            ref = off.reference(prompt, MT, **kw)
            text = j["choices"][0]["text"]
            plain = off.gen(prompt, **base_kw)[0]
            return ok and text == ref, (detail + f"; {'==' if text == ref else '!='} reference loop {ref!r}"
                                        + ("; differs from the unprocessed answer" if text != plain else
                                           "; same as the unprocessed answer"))
        return check

    def chat_equals_offline(messages=None, **kw):
        def check(j):
            text = j["choices"][0]["message"]["content"]
            msgs = messages or [{"role": "user", "content": P}]
            try:
                ref = off.gen(msgs, chat=True, **dict(base_kw, **kw))[0]
            except Exception as e:
                return False, f"offline refuses ({e}); server said {text!r}"
            return text == ref, f"{text!r} {'==' if text == ref else '!='} offline {ref!r}"
        return check

    def never_answered(why):
        return lambda j: (False, f"{why}; got {str(j)[:200]}")

    plain_ids = off.gen(P, **base_kw)[1]
    first = plain_ids[0]

    def banned(j):
        ok, detail = equals_offline(logit_bias={first: -100})(j)
        ids = off.gen(P, **dict(base_kw, logit_bias={first: -100}))[1]
        return ok and first not in ids, detail + f"; banned token {first} {'absent' if first not in ids else 'present'}"
    probes = []
    # logit_bias
    probes += [
        ("logit_bias ban first token", "logit_bias", {"logit_bias": {str(first): -100}}, banned),
        ("logit_bias +100 on '7'", "logit_bias", {"logit_bias": {"25": 100}}, equals_both(logit_bias={25: 100})),
        ("logit_bias +8 on '8'", "logit_bias", {"logit_bias": {"26": 8}}, equals_both(logit_bias={26: 8})),
        ("logit_bias ntp", "logit_bias", {"logit_bias": {str(first): -100}, "method": "ntp"},
         equals_offline(logit_bias={first: -100}, method="ntp")),
    ]
    # top_p
    probes += [
        ("top_p 0.01 sampled == greedy", "top_p", {"top_p": 0.01, "temperature": 1.0, "seed": 3},
         lambda j: (j["choices"][0]["text"] == off.gen(P, **base_kw)[0],
                    f"{j['choices'][0]['text']!r} vs greedy {off.gen(P, **base_kw)[0]!r}")),
        ("top_p 0.5 sampled", "top_p", {"top_p": 0.5, "temperature": 1.0, "seed": 7},
         equals_offline(top_p=0.5, temperature=1.0, seed=7, draft="block")),
        ("top_p 0.9 ntp sampled", "top_p", {"top_p": 0.9, "temperature": 1.2, "seed": 1, "method": "ntp"},
         equals_offline(top_p=0.9, temperature=1.2, seed=1, method="ntp")),
    ]
    # penalties
    for name, v in (("presence_penalty", 2.0), ("frequency_penalty", 2.0)):
        probes.append((f"{name} {v}", name, {name: v}, equals_both(**{name: v})))
    # a prompt whose answer these settings visibly change (found with the reference loop)
    P99 = "Add up: 99 + 99 - 99 + 99\n"
    for name, v in (("presence_penalty", -2.0), ("frequency_penalty", -2.0), ("logit_bias", {26: 8})):
        wire = {str(k): b for k, b in v.items()} if isinstance(v, dict) else v
        probes.append((f"{name} {v} (changes the answer)", name, {name: wire, "prompt": P99},
                       equals_both(P99, **{name: v})))
    # echo / best_of / suffix
    probes += [
        ("echo true", "echo", {"echo": True},
         lambda j: (j["choices"][0]["text"] == P + off.gen(P, **base_kw)[0],
                    f"{j['choices'][0]['text']!r} vs prompt + offline")),
        ("best_of 1", "best_of", {"best_of": 1}, equals_offline()),
        ("best_of 3 sampled", "best_of", {"best_of": 3, "temperature": 1.0, "seed": 4},
         never_answered("best_of 3 cannot be checked as honoured (no choice among 3 samples is visible)")),
        ("suffix 'xyz'", "suffix", {"suffix": " = 61"}, never_answered("suffix (insertion) cannot be honoured by a "
                                                                       "causal model without a fill-in mode")),
        ("suffix ''", "suffix", {"suffix": ""}, equals_offline()),
    ]

    # logprobs (completions)
    def logprobs_check(k):
        def check(j):
            lp = j["choices"][0].get("logprobs")
            ref = off.gen(P, **dict(base_kw, logprobs=k))
            if not lp or not isinstance(lp, dict):
                return False, f"no logprobs in the answer: {lp!r}"
            toks, tlp, top = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
            n = j["usage"]["completion_tokens"]
            if not (isinstance(toks, list) and isinstance(tlp, list) and len(toks) == len(tlp) == n):
                return False, f"tokens/token_logprobs lengths {len(toks or [])}/{len(tlp or [])} != {n} tokens"
            want = [e[1] for e in ref[2]]
            if len(want) != n or max(abs(a - b) for a, b in zip(tlp, want)) > 1e-3:
                return False, f"token_logprobs differ from offline: {tlp[:4]} vs {want[:4]}"
            if k > 0 and not all(isinstance(d, dict) and 1 <= len(d) <= k for d in top or [None]):
                return False, f"top_logprobs entries are not dicts of up to {k}: {str(top)[:120]}"
            return True, f"{n} token logprobs == offline (max |diff| {max(abs(a - b) for a, b in zip(tlp, want)):.1e})"
        return check

    for k in (0, 3, 5):
        probes.append((f"logprobs {k}", "logprobs", {"logprobs": k}, logprobs_check(k)))
    probes += [
        ("logprobs 6 (above OpenAI's 5)", "logprobs", {"logprobs": 6}, never_answered("logprobs 6 is above 5")),
        ("logprobs -1", "logprobs", {"logprobs": -1}, never_answered("negative logprobs")),
        ("echo with logprobs", "echo", {"echo": True, "logprobs": 1},
         lambda j: (bool(j["choices"][0].get("logprobs")) and j["choices"][0]["text"].startswith(P),
                    f"{str(j['choices'][0])[:200]}")),
    ]
    # n
    probes += [
        ("n 2 sampled", "n", {"n": 2, "temperature": 1.0, "seed": 9},
         lambda j: (lambda texts, ref: (texts == ref, f"{texts} vs offline {ref}"))(
             [c["text"] for c in sorted(j["choices"], key=lambda c: c["index"])],
             [off.gen(P, **dict(base_kw, temperature=1.0, seed=9 + i, draft="block"))[0] for i in range(2)])),
        ("temperature 1 seed 3", "temperature", {"temperature": 1.0, "seed": 3},
         equals_offline(temperature=1.0, seed=3, draft="block")),
        ("stop ['+']", "stop", {"stop": ["+"]}, equals_offline(stop=["+"])),
        ("user field", "user", {"user": "probe-user-1"}, equals_offline()),
    ]
    # lookup
    probes += [
        ("lookup true", "lookup", {"lookup": True}, equals_offline(lookup=True)),
        ("lookup false", "lookup", {"lookup": False}, equals_offline()),
        ("lookup 'banana'", "lookup", {"lookup": "banana"}, never_answered("lookup='banana' is not a boolean")),
        ("lookup 1 (int)", "lookup", {"lookup": 1}, equals_offline(lookup=True)),
        ("lookup with temperature 1", "lookup", {"lookup": True, "temperature": 1.0, "seed": 2},
         equals_offline(lookup=True, temperature=1.0, seed=2)),
        ("lookup with method ntp", "lookup", {"lookup": True, "method": "ntp"},
         equals_offline(lookup=True, method="ntp")),
    ]
    # unknown fields
    for field, v in (("max_token", 5), ("temprature", 0.5), ("foo", 1), ("tools", [])):
        probes.append((f"unknown field {field!r} (completions)", field, {field: v},
                       never_answered(f"{field} is not a field of /v1/completions")))
    if quick:
        probes = [p for p in probes if p[0] in ("logit_bias ban first token", "top_p 0.5 sampled", "echo true",
                                                "best_of 3 sampled", "logprobs 0", "lookup 'banana'",
                                                "unknown field 'max_token' (completions)", "presence_penalty 2.0")]
    for label, param, body, check in probes:
        server_probe(srv, 2, label, honoured_or_refused(param, body, check))

    # chat: honoured needs a chat template; served by chat_srv (the demo model with a template)
    tool = {"type": "function", "function": {"name": "add", "description": "add numbers",
                                             "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}

    def json_valid(j):
        text = j["choices"][0]["message"]["content"]
        try:
            json.loads(text)
            return True, f"valid JSON {text[:80]!r}"
        except ValueError:
            return False, f"not JSON: {text[:80]!r}"

    def called_tool(j):
        calls = j["choices"][0]["message"].get("tool_calls")
        return bool(calls), f"tool_calls={calls!r}, content={j['choices'][0]['message'].get('content')!r:.80}"

    chat_probes = [
        ("chat response_format json_object", "response_format", {"response_format": {"type": "json_object"}},
         json_valid),
        ("chat response_format json_schema", "response_format",
         {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}},
         json_valid),
        ("chat response_format text", "response_format", {"response_format": {"type": "text"}}, chat_equals_offline()),
        ("chat response_format bogus", "response_format", {"response_format": {"type": "yaml"}},
         never_answered("no such response_format")),
        ("chat tools auto", "tools", {"tools": [tool]}, never_answered("tools given but not in the prompt")),
        ("chat tools required", "tool", {"tools": [tool], "tool_choice": "required"}, called_tool),
        ("chat tool_choice named", "tool", {"tools": [tool], "tool_choice": {"type": "function",
                                                                           "function": {"name": "add"}}}, called_tool),
        ("chat tool_choice none, no tools", "tool_choice", {"tool_choice": "none"}, chat_equals_offline()),
        ("chat tools + parallel_tool_calls", "tool", {"tools": [tool], "parallel_tool_calls": False},
         never_answered("tools given but not in the prompt")),
        ("chat parallel_tool_calls alone", "parallel_tool_calls", {"parallel_tool_calls": True},
         chat_equals_offline()),
        ("chat logprobs true top 2", "logprobs", {"logprobs": True, "top_logprobs": 2},
         lambda j: (bool((j["choices"][0].get("logprobs") or {}).get("content"))
                    and len(j["choices"][0]["logprobs"]["content"]) == j["usage"]["completion_tokens"],
                    str(j["choices"][0].get("logprobs"))[:150])),
        ("chat top_logprobs without logprobs", "top_logprobs", {"top_logprobs": 2},
         never_answered("top_logprobs without logprobs")),
        ("chat max_completion_tokens 5", "max_completion_tokens", {"max_completion_tokens": 5, "max_tokens": None},
         lambda j: (j["usage"]["completion_tokens"] <= 5, f"{j['usage']}")),
        ("chat logit_bias", "logit_bias", {"logit_bias": {str(first): -100}},
         chat_equals_offline(logit_bias={first: -100})),
        ("chat presence_penalty 1.5", "presence_penalty", {"presence_penalty": 1.5},
         chat_equals_offline(presence_penalty=1.5)),
        ("chat unknown field max_token", "max_token", {"max_token": 5}, never_answered("unknown field")),
        ("chat lookup 'banana'", "lookup", {"lookup": "banana"}, never_answered("not a boolean")),
    ]
    for role in ("robot", "tool"):
        chat_probes.append((f"chat role {role!r}", "role",
                            {"messages": [{"role": role, "content": P}]}, never_answered(f"role {role!r}")))
    if quick:
        chat_probes = [p for p in chat_probes if p[0] in ("chat response_format json_object", "chat tools auto",
                                                          "chat role 'robot'", "chat response_format text")]
    for label, param, body, check in chat_probes:
        server_probe(chat_srv, 2, label, honoured_or_refused(param, body, check, endpoint="chat"))


CHAT_NAME = "demo-chat"
HEALTH_POLLER = """
import signal, sys, time, httpx
lat = {u: [] for u in sys.argv[1:]}
def done(*_):
    for u in sys.argv[1:]:
        print(" ".join(f"{x:.1f}" for x in lat[u]), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
clients = {u: httpx.Client(base_url=u, timeout=10) for u in sys.argv[1:]}
for c in clients.values():
    c.get("/health")
print("ready", flush=True)
while True:
    for u, c in clients.items():
        t = time.perf_counter()
        c.get("/health")
        lat[u].append((time.perf_counter() - t) * 1000)
    time.sleep(0.02)
"""


# ------------------------------------------------------------------------------------- group 4: client mistakes

def mistakes(srv: Server, chat_srv: Server, quick: bool) -> None:
    """Malformed bodies and values: every one a 4xx in OpenAI's shape, no traceback."""
    P = "Add up: 1 + 2\n"
    big = 10 ** 30
    cases: list[tuple[str, str | None, object]] = [
        # (label, param the error should name or None, body: dict for JSON, bytes for raw)
        ("seed 2**63", "seed", {"seed": 2 ** 63, "temperature": 1.0}),
        ("seed -2**63-1", "seed", {"seed": -(2 ** 63) - 1, "temperature": 1.0}),
        ("seed 10**30", "seed", {"seed": big, "temperature": 1.0}),
        ("lone surrogate in prompt", "prompt", b'{"prompt": "Add up: \\ud800 1", "max_tokens": 4}'),
        ("lone surrogate in stop", "stop", b'{"prompt": "Add up: 1", "stop": ["\\ud83d"], "max_tokens": 4}'),
        ("invalid UTF-8 bytes", None, b'{"prompt": "Add \xff\xfe up", "max_tokens": 4}'),
        ("not JSON", None, b"{prompt: nope"),
        ("empty body", None, b""),
        ("JSON null", None, b"null"),
        ("JSON array", None, b"[1, 2]"),
        ("nesting 100000 deep", None, b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
        ("temperature NaN", "temperature", b'{"prompt": "Add up: 1", "temperature": NaN}'),
        ("temperature 1e400", "temperature", b'{"prompt": "Add up: 1", "temperature": 1e400}'),
        ("temperature 2.5", "temperature", {"temperature": 2.5}),
        ("max_tokens 0", "max_tokens", {"max_tokens": 0}),
        ("max_tokens 10**30", "max_tokens", {"max_tokens": big}),
        ("max_tokens '16'", "max_tokens", {"max_tokens": "16"}),
        ("n 10**30", "n", {"n": big}),
        ("block_size 10**9", "block_size", {"block_size": 10 ** 9}),
        ("gamma -1", "gamma", {"gamma": -1, "method": "sbd"}),
        ("method 'beam'", "method", {"method": "beam"}),
        ("draft 'zzz'", "draft", {"draft": "zzz"}),
        ("stop 5 strings", "stop", {"stop": ["a", "b", "c", "d", "e"]}),
        ("stop 100k chars", "stop", {"stop": ["x" * 100000]}),
        ("logit_bias key 'abc'", "logit_bias", {"logit_bias": {"abc": 1}}),
        ("logit_bias token 999999", "logit_bias", {"logit_bias": {"999999": 1}}),
        ("logit_bias value 500", "logit_bias", {"logit_bias": {"5": 500}}),
        ("logit_bias mask token", "logit_bias", {"logit_bias": {"2": 10}}),
        ("top_p 0", "top_p", {"top_p": 0, "temperature": 1}),
        ("presence_penalty 3", "presence_penalty", {"presence_penalty": 3}),
        ("prompt missing", "prompt", {"prompt": None}),
        ("prompt ''", "prompt", {"prompt": ""}),
        ("prompt []", "prompt", {"prompt": []}),
        ("prompt 5", "prompt", {"prompt": 5}),
        ("prompt batched token lists", "prompt", {"prompt": [[5, 6], [7, 8]]}),
        ("prompt token = vocab", "prompt", {"prompt": [5, 1024]}),
        ("prompt token 10**30", "prompt", {"prompt": [5, big]}),
        ("prompt mask token", "prompt", {"prompt": [5, 2, 6]}),
        ("model 'gpt-4'", "model", {"model": "gpt-4"}),
        ("model with surrogate", "model", b'{"model": "\\ud800", "prompt": "x"}'),
    ]
    chat_cases = [
        ("chat messages missing", "messages", {}),
        ("chat messages []", "messages", {"messages": []}),
        ("chat messages 'hi'", "messages", {"messages": "hi"}),
        ("chat message without content", "content", {"messages": [{"role": "user"}]}),
        ("chat message without role", "role", {"messages": [{"content": "x"}]}),
        ("chat content 5", "content", {"messages": [{"role": "user", "content": 5}]}),
        ("chat image part", "content", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}),
        ("chat lone surrogate content", "content", b'{"messages": [{"role": "user", "content": "a\\ud800"}]}'),
        ("chat seed 2**64", "seed", {"seed": 2 ** 64, "temperature": 1.0,
                                     "messages": [{"role": "user", "content": "x"}]}),
    ]
    if quick:
        keep = ("seed 2**63", "lone surrogate in prompt", "not JSON", "nesting 100000 deep", "max_tokens 10**30",
                "prompt token 10**30", "temperature NaN", "model 'gpt-4'")
        cases = [c for c in cases if c[0] in keep]
        chat_cases = chat_cases[:2] + chat_cases[-2:]

    def send(s: Server, path: str, body, default: dict):
        if isinstance(body, bytes):
            return s.post(path, content=body)
        merged = dict(default, **body)
        merged = {k: v for k, v in merged.items() if v is not None}
        return s.post(path, content=json.dumps(merged).encode())

    for label, param, body in cases:
        status = (404,) if label.startswith("model") else (400, 413, 422)
        server_probe(srv, 4, label, lambda b=body, p=param, st=status: expect_refusal(
            send(srv, "/v1/completions", b, {"prompt": P, "max_tokens": 4}), p, st))
    for label, param, body in chat_cases:
        server_probe(chat_srv, 4, label, lambda b=body, p=param: expect_refusal(
            send(chat_srv, "/v1/chat/completions", b, {"max_tokens": 4}), p, (400, 422)))


# ------------------------------------------------------------------------------------------ group 3: big requests

def big_requests(srv: Server, small: Server, off: Offline, quick: bool) -> None:
    """srv: --max-body-bytes 32 MiB --max-prompt-tokens 200 (10 MB prompts are read); small: the default limits."""
    ten_mb = ("Add up: 12 + 7 - 3 + 45\n" * (10_000_000 // 24 + 1))[:10_000_000]
    body_str = json.dumps({"model": "demo", "prompt": ten_mb, "max_tokens": 8}).encode()
    body_ids = json.dumps({"model": "demo", "prompt": [5] * 2_500_000, "max_tokens": 8}).encode()  # ~10 MB of ids

    def with_health(target: Server, control: Server, bodies: list[bytes], path: str = "/v1/completions"):
        """Send `bodies` to `target` at once while /health is polled; (responses, worst and median /health ms,
        seconds, the idle `control` server's worst /health ms)."""
        # /health is polled from a process of its own, so that this process's uploads do not delay it, and an
        # idle server's /health beside it: a control for the shared machine's own hiccups
        poller = subprocess.Popen([sys.executable, "-c", HEALTH_POLLER, target.base, control.base],
                                  stdout=subprocess.PIPE, text=True)
        headers = {"content-type": "application/json"}
        if target.needs_key:
            headers["authorization"] = f"Bearer {KEY}"
        assert poller.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(bodies)) as ex:
            resps = list(ex.map(lambda b: httpx.post(target.base + path, content=b, timeout=REQ_TIMEOUT,
                                                     headers=headers), bodies))
        secs = time.monotonic() - t0
        time.sleep(0.3)
        poller.send_signal(signal.SIGTERM)
        out = poller.communicate(timeout=30)[0].splitlines() + ["", ""]
        lat, control = (sorted(float(x) for x in line.split()) for line in out[:2])
        nan = float("nan")
        return resps, (lat[-1] if lat else nan), (lat[len(lat) // 2] if lat else nan), secs, (control[-1] if control
                                                                                             else nan)

    rss0 = rss_mib(srv.proc.pid)
    just_under = json.dumps({"model": "demo", "prompt": "Add up: 1 + 2\n" * 69_000, "max_tokens": 8}).encode()
    assert len(just_under) < 1 << 20
    scenarios = [  # (target, control, label, bodies)
        (small, srv, "default limits: three 10 MB prompts at once", [body_str] * 3),
        (small, srv, "default limits: three ~1 MB prompts (just under 1 MiB) at once", [just_under] * 3),
        (srv, small, "--max-body-bytes 32 MiB: one 10 MB prompt", [body_str]),
        (srv, small, "--max-body-bytes 32 MiB: three 10 MB prompts at once", [body_str] * 3),
        (srv, small, "--max-body-bytes 32 MiB: 10 MB of token ids", [body_ids]),
    ]
    if quick:
        scenarios = scenarios[:1] + scenarios[3:4]
    for target, control, label, bodies in scenarios:
        holder = {}

        def fn(bodies=bodies, target=target, control=control):
            # twice: the machine is shared, so one slow /health may be someone else's load; the better run counts
            runs = [with_health(target, control, bodies) for _ in range(2)]
            holder.update(worsts=[r[1] for r in runs], meds=[r[2] for r in runs], controls=[r[4] for r in runs])
            resps, secs = runs[0][0] + runs[1][0], runs[0][3]
            outs = [expect_refusal(r, None if r.status_code == 413 else "prompt", (400, 413)) for r in resps]
            bad = [o for o in outs if o[0] != "OK"]
            if bad:
                return bad[0][0], f"{len(bad)}/{len(resps)} not refused properly: {bad[0][1]}"
            return "OK", f"{len(resps)} x {resps[0].status_code} over two runs ({secs:.1f} s the first): {outs[0][1][:100]}"

        server_probe(target, 3, label + ": refused (400 / 413)", fn)
        server_probe(target, 3, label + ": /health < 100 ms meanwhile", lambda h=holder: (
            ("OK" if min(h.get("worsts", [1e9])) < 100 else "silent-wrong"),
            "/health worst " + " / ".join(f"{x:.0f}" for x in h.get("worsts", [])) + " ms in two runs (medians "
            + " / ".join(f"{x:.0f}" for x in h.get("meds", [])) + " ms); the idle control server's worst "
            + " / ".join(f"{x:.0f}" for x in h.get("controls", [])) + " ms meanwhile"))

    def memory():
        time.sleep(2.0)
        after = rss_mib(srv.proc.pid)
        grown = after - rss0
        return ("OK" if grown < 64 else "silent-wrong"), f"server RSS {rss0:.0f} -> {after:.0f} MiB (+{grown:.0f})"

    server_probe(srv, 3, "memory returns after the 10 MB prompts (--max-body-bytes 32 MiB server, < +64 MiB)",
                 memory)

    def chat_big():
        body = json.dumps({"messages": [{"role": "user", "content": ten_mb}], "max_tokens": 4}).encode()
        return expect_refusal(srv.post("/v1/chat/completions", content=body), "messages", (400, 413))

    if not quick:
        server_probe(srv, 3, "10 MB chat message: refused", chat_big)

    # prompt-token limit (srv: --max-prompt-tokens 200)
    def prompt_tokens(n_tokens: int, want_ok: bool):
        def fn():
            r = srv.post("/v1/completions", {"model": "demo", "prompt": [5] * n_tokens, "max_tokens": 4})
            if want_ok:
                return ("OK" if r.status_code == 200 else "silent-wrong"), f"{n_tokens} tokens: HTTP {r.status_code}"
            out = expect_refusal(r, "prompt")
            if out[0] == "OK" and r.json()["error"].get("code") != "context_length_exceeded":
                return "silent-wrong", f"400 without code context_length_exceeded: {r.json()['error']}"
            return out
        return fn

    server_probe(srv, 3, "prompt 250 tokens > --max-prompt-tokens 200: 400", prompt_tokens(250, False))
    server_probe(srv, 3, "prompt 150 tokens <= --max-prompt-tokens 200: 200", prompt_tokens(150, True))
    if not quick:
        text_long = "Add up: 1 + 2 + 3 + 4 + 5\n" * 40  # far beyond 200 tokens, far below the body limit
        server_probe(srv, 3, "text prompt > --max-prompt-tokens: 400", lambda: expect_refusal(
            srv.post("/v1/completions", {"model": "demo", "prompt": text_long, "max_tokens": 4}), "prompt"))
        server_probe(srv, 3, "prompt + max_tokens > context: 400 context_length_exceeded", lambda: expect_refusal(
            srv.post("/v1/completions", {"model": "demo", "prompt": [5] * 190, "max_tokens": 200}), None))

    # body-size limit on the default server (1 MiB)
    two_mb = json.dumps({"model": "demo", "prompt": "x" * 2_000_000, "max_tokens": 4}).encode()

    def limit(content, label_chunked=False):
        def fn():
            t = time.monotonic()
            if label_chunked:
                def gen():
                    for i in range(0, len(content), 65536):
                        yield content[i:i + 65536]
                r = small.http.post("/v1/completions", content=gen(), headers={
                    "content-type": "application/json", "authorization": f"Bearer {KEY}"})
            else:
                r = small.post("/v1/completions", content=content)
            out = expect_refusal(r, None, (413,))
            return out[0], f"{out[1]} ({time.monotonic() - t:.2f} s)"
        return fn

    server_probe(small, 3, "2 MB body > default 1 MiB limit: 413", limit(two_mb))
    if not quick:
        server_probe(small, 3, "2 MB chunked body (no Content-Length): 413", limit(two_mb, True))
        over = json.dumps({"model": "demo", "prompt": "x" * 34_000_000, "max_tokens": 4}).encode()
        server_probe(srv, 3, "34 MB body > --max-body-bytes 32 MiB: 413", lambda: expect_refusal(
            srv.post("/v1/completions", content=over), None, (413,)))

    def after_big():
        P = "Add up: 3 + 4 - 1 + 9\n"
        r = srv.post("/v1/completions", {"model": "demo", "prompt": P, "max_tokens": 16})
        ref = off.gen(P, method="sbd-verify", max_new_tokens=16)[0]
        if r.status_code != 200:
            return "silent-wrong", f"HTTP {r.status_code}"
        t = r.json()["choices"][0]["text"]
        return ("OK" if t == ref else "silent-wrong"), f"{t!r} vs offline {ref!r}"

    server_probe(srv, 3, "a normal request after the big ones equals offline", after_big)


# -------------------------------------------------------------------------------------------------- group 6: auth

def auth(keyed: Server, env_keyed: Server, open_srv: Server, off: Offline, quick: bool) -> None:
    P = "Add up: 5 + 6 - 2 + 10\n"
    body = {"model": "demo", "prompt": P, "max_tokens": 8}

    def want_401(s: Server, method: str, path: str, auth_header: str | None):
        def fn():
            h = {} if auth_header is None else {"authorization": auth_header}
            r = s.http.request(method, path, json=body if method == "POST" else None, headers=h)
            out = expect_refusal(r, None, (401,))
            return out
        return fn

    for s, tag in ((keyed, "--api-key"), (env_keyed, "SBD_API_KEY")):
        routes = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                  ("GET", "/metrics")]
        if quick:
            routes = routes[:1]
        elif s is env_keyed:
            routes = [routes[0], routes[2]]
        for method, path in routes:
            for how, hdr in (("no key", None), ("wrong key", "Bearer sk-wrong"), ("bare 'Bearer'", "Bearer"),
                             ("key without Bearer", KEY)):
                if how in ("bare 'Bearer'", "key without Bearer") and (quick or path != "/v1/completions"):
                    continue
                server_probe(s, 6, f"{tag}: {how} {method} {path} -> 401", want_401(s, method, path, hdr))

        def health_open(s=s):
            r = s.http.get("/health")
            return ("OK" if r.status_code == 200 else "silent-wrong"), f"/health without a key: HTTP {r.status_code}"

        server_probe(s, 6, f"{tag}: /health open without a key", health_open)

        def right_key(s=s):
            c = openai.OpenAI(base_url=s.base + "/v1", api_key=KEY, max_retries=0, timeout=REQ_TIMEOUT)
            model = CHAT_NAME if s is env_keyed else "demo"
            t = c.completions.create(model=model, prompt=P, max_tokens=8).choices[0].text
            ref = off.gen(P, method="sbd-verify", max_new_tokens=8)[0]
            return ("OK" if t == ref else "silent-wrong"), f"right key: {t!r} vs offline {ref!r}"

        server_probe(s, 6, f"{tag}: right key through the openai client answers", right_key)

        def wrong_key_client(s=s):
            c = openai.OpenAI(base_url=s.base + "/v1", api_key="sk-wrong", max_retries=0, timeout=REQ_TIMEOUT)
            try:
                c.completions.create(model="demo", prompt=P, max_tokens=8)
            except openai.AuthenticationError as e:
                return ("OK" if openai_shaped(e.response.json()) else "silent-wrong"), f"AuthenticationError {e.body}"
            except openai.APIStatusError as e:
                return "silent-wrong", f"HTTP {e.status_code}, not 401"
            return "silent-wrong", "answered with a wrong key"

        server_probe(s, 6, f"{tag}: wrong key through the openai client -> AuthenticationError", wrong_key_client)

    def big_unauth():
        t = time.monotonic()
        r = keyed.http.post("/v1/completions", content=b'{"prompt": "' + b"x" * 5_000_000 + b'"}',
                            headers={"content-type": "application/json"})
        out = expect_refusal(r, None, (401,))
        return out[0], f"{out[1]} in {time.monotonic() - t:.2f} s"

    if not quick:
        server_probe(keyed, 6, "--api-key: 5 MB body without a key -> 401 (not 413, not read)", big_unauth)

    def warning(s: Server, want: bool, what: str):
        def fn():
            err = s.stderr_all()
            has = "warning" in err.lower() and ("api-key" in err.lower() or "api key" in err.lower())
            ok = has == want
            return ("OK" if ok else "silent-wrong"), f"{what}: warning {'printed' if has else 'not printed'}"
        return fn

    server_probe(open_srv, 6, "--host 0.0.0.0 without a key: warning on stderr", warning(
        open_srv, True, "bound to 0.0.0.0, no key"))
    server_probe(env_keyed, 6, "--host 0.0.0.0 with SBD_API_KEY: no warning", warning(
        env_keyed, False, "bound to 0.0.0.0 with a key"))


# ----------------------------------------------------------------------------------------------- group 9: minor

def minor(srv: Server, chat_srv: Server, off: Offline, work: Path, quick: bool) -> None:
    def shaped(method: str, path: str, status: int, s: Server = srv):
        def fn():
            r = s.http.request(method, path, headers={"authorization": f"Bearer {KEY}"})
            return expect_refusal(r, None, (status,))
        return fn

    server_probe(srv, 9, "unknown route -> 404 in OpenAI's shape", shaped("POST", "/v1/nothing", 404))
    server_probe(srv, 9, "GET /v1/completions -> 405 in OpenAI's shape", shaped("GET", "/v1/completions", 405))
    if not quick:
        server_probe(srv, 9, "DELETE /health -> 405 in OpenAI's shape", shaped("DELETE", "/health", 405))
        server_probe(srv, 9, "GET /v1/engines (legacy) -> 404 in OpenAI's shape", shaped("GET", "/v1/engines", 404))
        server_probe(srv, 9, "missing messages -> 400 in OpenAI's shape", lambda: expect_refusal(
            srv.post("/v1/chat/completions", {"model": "demo"}), "messages"))

    P = "Add up: 8 + 1 - 4 + 22\n"

    def parts(content, s: Server, name: str):
        def fn():
            r = s.post("/v1/chat/completions", {"model": name, "max_tokens": 12,
                                                 "messages": [{"role": "user", "content": content}]})
            r0 = s.post("/v1/chat/completions", {"model": name, "max_tokens": 12,
                                                  "messages": [{"role": "user", "content": P}]})
            if r0.status_code != 200:  # no chat template: a list of parts must be taken like the string
                same = r.status_code == r0.status_code and jbody(r) == jbody(r0)
                return ("OK" if same else "silent-wrong"), \
                    f"string content: {r0.status_code}; parts: {r.status_code} {str(jbody(r))[:150]}"
            if r.status_code != 200:
                return "silent-wrong", f"text parts refused: {r.status_code} {str(jbody(r))[:150]}"
            t = r.json()["choices"][0]["message"]["content"]
            ref = off.gen([{"role": "user", "content": P}], chat=True, method="sbd-verify", max_new_tokens=12)[0]
            return ("OK" if t == ref else "silent-wrong"), f"{t!r} vs offline {ref!r}"
        return fn

    server_probe(chat_srv, 9, "chat content as one text part", parts([{"type": "text", "text": P}], chat_srv,
                                                                      CHAT_NAME))
    server_probe(srv, 9, "chat content as text parts, demo (no template): same as a string",
                 parts([{"type": "text", "text": P}], srv, "demo"))

    def two_parts():
        r = chat_srv.post("/v1/chat/completions", {"model": CHAT_NAME, "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Add up: 8 + 1"}, {"type": "text", "text": "- 4"}]}]})
        return ("OK" if r.status_code == 200 else "silent-wrong"), f"two text parts: HTTP {r.status_code}"

    if not quick:
        server_probe(chat_srv, 9, "chat content as two text parts accepted", two_parts)

    def busy(s: Server, host: str):
        def fn():
            t = time.monotonic()
            rc, out, err, secs = run_cli([SBD, "serve", "--model", "demo", "--threads", "1", "--host", host,
                                          "--port", str(s.port)], work, timeout=90)
            bad = cli_outcome(rc, err)
            if bad:
                return bad
            if rc == 0:
                return "silent-wrong", "exit status 0 on a busy port"
            if "serving" in out:
                return "silent-wrong", f"printed 'serving' before failing: {out.strip()[:120]}"
            if not one_line_error(err):
                return "silent-wrong", f"not one line: {err.strip()[:200]!r}"
            return "OK", f"rc {rc} in {time.monotonic() - t:.1f} s: {err.strip()}"
        return fn

    server_probe(srv, 9, "second sbd serve on a taken port (0.0.0.0): one line, no 'serving'", busy(srv, "0.0.0.0"))
    if not quick:
        server_probe(srv, 9, "second sbd serve on a taken port (127.0.0.1): one line", busy(srv, "127.0.0.1"))

    def models_list():
        c = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=REQ_TIMEOUT)
        ids = [m.id for m in c.models.list()]
        return ("OK" if ids == ["demo"] else "silent-wrong"), f"models {ids}"

    server_probe(srv, 9, "openai client models.list()", models_list)

    def stream_usage():
        c = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=REQ_TIMEOUT)
        chunks = list(c.completions.create(model="demo", prompt=P, max_tokens=12, stream=True,
                                           stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        usage = [ch.usage for ch in chunks if ch.usage]
        ref = off.gen(P, method="sbd-verify", max_new_tokens=12)[0]
        ok = text == ref and bool(usage)
        return ("OK" if ok else "silent-wrong"), f"stream {text!r} vs {ref!r}; usage chunk: {bool(usage)}"

    server_probe(srv, 9, "stream with include_usage equals offline, usage on the last chunk", stream_usage)


# ---------------------------------------------------------------------------------------------- group 5: Ctrl-C

def ctrl_c(srv: Server, presses: int, off: Offline, label: str, short: bool = False) -> None:
    """`presses` SIGINTs 0.3 s apart with 4 requests in flight (ntp, EOS banned, 240 tokens: seconds each);
    `short`: requests of 12 tokens, so that the first Ctrl-C drains at once and the second lands during the
    shutdown."""
    P = "Add up: 14 + 23\n"
    results: list = []
    request = {"model": srv.served, "prompt": P, "max_tokens": 240, "method": "ntp", "logit_bias": {"0": -100}}
    if short:
        request = {"model": srv.served, "prompt": P, "max_tokens": 12}

    def client(i: int):
        t = time.monotonic()
        try:
            with httpx.Client(timeout=30) as c:
                h = {"authorization": f"Bearer {KEY}"} if srv.needs_key else {}
                r = c.post(srv.base + "/v1/completions", json=request, headers=h)
                results.append((i, r.status_code, jbody(r), time.monotonic() - t))
        except httpx.TimeoutException:
            results.append((i, "hang", None, time.monotonic() - t))
        except httpx.HTTPError as e:
            results.append((i, "dropped", type(e).__name__, time.monotonic() - t))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    # wait until the requests are being decoded
    deadline, running = time.monotonic() + 10, 0
    while time.monotonic() < deadline:
        try:
            running = httpx.get(srv.base + "/health", timeout=2).json().get("running", 0)
            if running >= (1 if short else 4):
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    srv.new_stderr()
    t0 = time.monotonic()
    for k in range(presses):
        if srv.alive():
            srv.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    try:
        rc = srv.proc.wait(timeout=30 if presses == 1 else 15)
    except subprocess.TimeoutExpired:
        rc = None
    exit_s = time.monotonic() - t0
    for th in threads:
        th.join(timeout=35)
    err = srv.new_stderr()
    name = f"{label}: {presses} Ctrl-C with 4 requests in flight" + (", the second during the shutdown" if short else "")
    print(f"   ({name}: {running} rows running at the first Ctrl-C)", flush=True)
    if rc is None:
        REC.add(5, name + ": exits", "hang", f"still running {exit_s:.0f} s after the Ctrl-C", exit_s)
        srv.proc.kill()
        srv.proc.wait()
    elif (rc < 0 and rc != -signal.SIGINT) or rc in (134, 137, 139) or "terminate called" in err or "Aborted" in err:
        REC.add(5, name + ": exits", "crash", f"rc {rc}; stderr tail {err.strip()[-200:]!r}", exit_s)
    else:  # ended by the user's own SIGINT (a shell shows 130) counts as a clean exit
        limit = 20 if presses == 1 else 5
        ok = exit_s < limit
        how = "ended by SIGINT itself (shell: 130)" if rc == -signal.SIGINT else f"rc {rc}"
        REC.add(5, name + ": exits", "OK" if ok else "hang", f"{how} after {exit_s:.1f} s (limit {limit} s)", exit_s)
    REC.add(5, name + ": no traceback", "traceback" if TRACEBACK in err else "OK",
            err.strip()[-200:] if TRACEBACK in err else "clean stderr", 0)
    hung = [r for r in results if r[1] == "hang"] + [None] * (4 - len(results))
    REC.add(5, name + ": clients get an answer or a closed connection", "hang" if hung else "OK",
            f"{len(hung)} client(s) hung; outcomes {[r[1] for r in results]}", 0)
    if presses == 1:
        ref = off.gen(P, method="ntp", max_new_tokens=240, logit_bias={0: -100})[0]
        done = [r for r in results if r[1] == 200]
        right = [r for r in done if r[2]["choices"][0]["text"] == ref]
        ok = len(right) == 4
        REC.add(5, name + ": the running requests finish and equal offline", "OK" if ok else "silent-wrong",
                f"{len(right)}/4 finished and equal offline; statuses {[r[1] for r in results]}", 0)


# ----------------------------------------------------------------------------------------- group 7: distill

def mounted(path: Path, opts: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True).returncode == 0


MOUNTS: list[Path] = []


def distill_probes(work: Path, quick: bool) -> Path | None:
    """Returns the distilled file (for group 8)."""
    w = work / "distill"
    w.mkdir()
    prompts = [ADD.format(i, 3 * i % 17, i % 5, 2 * i).strip() for i in range(1, 13)]
    (w / "p.txt").write_text("\n".join(prompts) + "\n")
    (w / "p2.txt").write_text("\n".join(p.replace("Add up", "Sum") for p in prompts) + "\n")
    (w / "p40.txt").write_text("\n".join(ADD.format(i, i + 1, i % 3, 7).strip() for i in range(40)) + "\n")
    base = [SBD, "distill", "--model", "demo", "--no-chat", "--threads", "1", "--no-progress"]
    out = w / "o.jsonl"
    out.write_bytes(b"")

    def records(path: Path) -> list[dict] | None:
        try:
            return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        except (ValueError, OSError):
            return None

    def cli_probe(name: str, args: list[str], check, timeout: float = 180):
        rc, so, se, secs = run_cli(base + args, w, timeout)
        bad = cli_outcome(rc, se)
        outcome, detail = check(rc, so, se)
        if bad and outcome == "OK":
            outcome, detail = bad[0], bad[1]
        elif bad and outcome != "data-loss":
            outcome, detail = bad[0], f"{bad[1]}; {detail}"
        REC.add(7, name, outcome, detail, secs)

    # 1. an empty existing --out is taken as new
    def first(rc, so, se):
        recs = records(out)
        ok = rc == 0 and recs is not None and len(recs) == 12
        return ("OK" if ok else "silent-wrong"), f"rc {rc}, {len(recs or [])} records; {se.strip()[-150:]!r}"

    cli_probe("empty existing --out taken as new, 12 records", ["--prompts", "p.txt", "--out", "o.jsonl",
                                                                "--max-new-tokens", "8"], first)
    if not (records(out) or []):
        return None
    snapshot = {p.name: p.read_bytes() for p in (out, w / "o.jsonl.meta.json") if p.exists()}

    def intact_and_refused(files: dict[str, bytes], names_: tuple[str, ...] = ()):
        def check(rc, so, se):
            changed = [n for n, b in files.items() if not (w / n).exists() or (w / n).read_bytes() != b]
            if changed:
                return "data-loss", f"changed: {changed}; rc {rc}; {se.strip()[-150:]!r}"
            if rc == 0:
                return "silent-wrong", f"accepted (rc 0): {so.strip()[-150:]!r}"
            if not one_line_error(se):
                return "silent-wrong", f"not one line: {se.strip()[-200:]!r}"
            if names_ and not any(n in se for n in names_):
                return "silent-wrong", f"does not name {names_}: {se.strip()!r}"
            return "OK", f"refused, intact: {se.strip()[:180]}"
        return check

    foreign = {
        "notes.jsonl": b"my own notes\nline two\n",
        "other.jsonl": b'{"id": 1, "text": "a record of another tool"}\n{"id": 2, "text": "b"}\n',
        "older.jsonl": snapshot["o.jsonl"],  # an older sbd's output: records, no sidecar
        "binary.jsonl": bytes(range(256)) * 4,
    }
    for fname, data in foreign.items():
        if quick and fname in ("other.jsonl", "binary.jsonl"):
            continue
        (w / fname).write_bytes(data)
        cli_probe(f"--out a foreign existing file ({fname}) refused and intact",
                  ["--prompts", "p.txt", "--out", fname, "--max-new-tokens", "8"], intact_and_refused({fname: data}))
    resume_cases = [
        ("resume with other prompts refused naming them", ["--prompts", "p2.txt", "--max-new-tokens", "8"],
         ("prompt", "source", "p2.txt")),
        ("resume with other --max-new-tokens refused naming it", ["--prompts", "p.txt", "--max-new-tokens", "9"],
         ("max_new_tokens", "max-new-tokens")),
        ("resume with another --temperature refused naming it", ["--prompts", "p.txt", "--max-new-tokens", "8",
                                                                 "--temperature", "0.7"], ("temperature",)),
        ("resume with a longer, different prompt list refused", ["--prompts", "p40.txt", "--max-new-tokens", "8"],
         ("prompt", "source", "p40.txt")),
    ]
    if quick:
        resume_cases = resume_cases[:2]
    for name, args, nm in resume_cases:
        cli_probe(name, args + ["--out", "o.jsonl"], intact_and_refused(snapshot, nm))

    def same_again(rc, so, se):
        now = out.read_bytes()
        if now != snapshot["o.jsonl"]:
            return "data-loss", "the same command changed a finished output"
        return ("OK" if rc == 0 else "silent-wrong"), f"rc {rc}: {(so + se).strip()[-150:]!r}"

    if not quick:
        cli_probe("resume with the same command: nothing changes", ["--prompts", "p.txt", "--out", "o.jsonl",
                                                                   "--max-new-tokens", "8"], same_again)

    # kill -9 during the start-up rewrite (a torn last line makes distill rewrite the file)
    lines = snapshot["o.jsonl"].decode().splitlines(keepends=True)
    k = w / "k.jsonl"
    torn = "".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2]
    k.write_text(torn)
    (w / "k.jsonl.meta.json").write_bytes(snapshot["o.jsonl.meta.json"])
    whole = "".join(lines[:-1])
    ino = k.stat().st_ino
    t0 = time.monotonic()
    proc = subprocess.Popen(base + ["--prompts", "p.txt", "--out", "k.jsonl", "--max-new-tokens", "8"], cwd=w,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    phase = "never saw the rewrite (killed after 60 s or at exit)"
    while time.monotonic() - t0 < 60 and proc.poll() is None:
        if (w / ".k.jsonl.tmp").exists():
            phase = "killed while the temp file existed (during the rewrite)"
            break
        try:
            if k.stat().st_ino != ino:
                phase = "killed just after the rewrite's rename"
                break
            if k.stat().st_size > len(torn):
                phase = "killed after it appended (rewrite already done in place?)"
                break
        except FileNotFoundError:
            phase = "killed while --out did not exist (!)"
            break
    proc.kill()
    proc.wait()
    text = k.read_text() if k.exists() else ""
    kept = text.startswith(whole)
    REC.add(7, "kill -9 during the start-up rewrite: complete records kept",
            "OK" if kept else "data-loss",
            f"{phase}; {len(whole.splitlines())} complete records {'kept' if kept else 'NOT kept'} "
            f"({len(text.splitlines())} lines now)", time.monotonic() - t0)

    def after_kill(rc, so, se):
        recs = records(k)
        if recs is None or not k.read_text().startswith(whole):
            return "data-loss", f"file unreadable or records lost after resume; rc {rc}"
        full = k.read_text() == snapshot["o.jsonl"].decode() or (
            len(recs) == 12 and sorted(r["index"] for r in recs) == list(range(12)))
        return ("OK" if rc == 0 and full else "silent-wrong"), f"rc {rc}, {len(recs)} records after resume"

    cli_probe("after the kill, the same command completes all 12 records", ["--prompts", "p.txt", "--out", "k.jsonl",
                                                                           "--max-new-tokens", "8"], after_kill)

    # a directory, a missing folder, a read-only place, a full disk
    (w / "adir").mkdir()
    one_line = lambda rc, so, se: (("OK" if rc not in (0, None) and one_line_error(se) else "silent-wrong"),
                                   f"rc {rc}: {se.strip()[-200:]!r}")
    cli_probe("a directory as --out: one line", ["--prompts", "p.txt", "--out", "adir", "--max-new-tokens", "8"],
              one_line)
    if not quick:
        def missing(rc, so, se):
            if rc == 0:
                return ("OK" if records(w / "nope" / "deeper" / "o.jsonl") else "silent-wrong"), "created the folders"
            return one_line(rc, so, se)
        cli_probe("--out in a missing folder: one line or created", ["--prompts", "p.txt", "--out", "nope/deeper/o.jsonl",
                                                                     "--max-new-tokens", "8"], missing)
    ro = w / "ro"
    if mounted(ro, "size=1m") and not MOUNTS.append(ro) and \
            subprocess.run(["mount", "-o", "remount,ro", str(ro)]).returncode == 0:
        cli_probe("a read-only place (read-only tmpfs): one line", ["--prompts", "p.txt", "--out", "ro/o.jsonl",
                                                                    "--max-new-tokens", "8"], one_line)
    else:
        REC.add(7, "a read-only place: one line", "silent-wrong", "probe could not mount a read-only tmpfs (not root?)")
    full = w / "full"
    if mounted(full, "size=64k"):
        MOUNTS.append(full)
        filler = full / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        os.truncate(filler, max(0, filler.stat().st_size // 4096 * 4096 - 8192))

        def disk_full(rc, so, se):
            path = full / "o.jsonl"
            try:
                raw = path.read_text() if path.exists() else ""
            except OSError:
                raw = ""
            torn_end = bool(raw) and not raw.endswith("\n")
            recs = records(path) if path.exists() else []
            if recs is None or torn_end:
                return "data-loss", f"a torn record left behind (rc {rc}): {raw[-80:]!r}"
            if rc == 0:
                return "silent-wrong", f"rc 0 on a full disk with {len(recs)} of 40 records"
            ok = one_line_error(se)
            return ("OK" if ok else "silent-wrong"), f"rc {rc}, {len(recs)} whole records kept: {se.strip()[-180:]!r}"

        cli_probe("a full disk (64k tmpfs): one line, whole records only", ["--prompts", "p40.txt", "--out",
                                                                            "full/o.jsonl", "--max-new-tokens", "8"],
                  disk_full)
    else:
        REC.add(7, "a full disk: one line", "silent-wrong", "probe could not mount a small tmpfs (not root?)")
    return out


# ------------------------------------------------------------------------------------------- group 8: train

def train_probes(work: Path, data: Path | None, quick: bool) -> None:
    w = work / "train"
    w.mkdir()
    if data is None or not data.exists():
        data = w / "d.jsonl"
        data.write_text("".join(json.dumps({"prompt": ADD.format(i, i, 1, 2), "completion": f"{2 * i + 1}"}) + "\n"
                                for i in range(12)))
    shutil.copy(data, w / "d.jsonl")
    base = [SBD, "train", "--model", "demo", "--data", "d.jsonl", "--adapter", "lora", "--steps", "2",
            "--batch-size", "2", "--no-progress", "--save-steps", "1000"]

    def refused(name: str, rank: str, timeout: float = 240):
        rc, so, se, secs = run_cli(base + ["--out", f"r{rank}", "--rank", rank], w, timeout)
        bad = cli_outcome(rc, se)
        if bad:
            REC.add(8, name, bad[0], bad[1], secs)
            return
        ok = rc not in (0, None) and one_line_error(se)
        REC.add(8, name, "OK" if ok else "silent-wrong", f"rc {rc} in {secs:.0f} s: {se.strip()[-200:]!r}", secs)

    refused("--rank 100000 refused in one line (not OOM-killed)", "100000")
    if not quick:
        refused("--rank 0 refused in one line", "0")
    rc, so, se, secs = run_cli(base + ["--out", "ad", "--rank", "4"], w, 300)
    bad = cli_outcome(rc, se)
    cfg = {}
    try:
        cfg = json.loads((w / "ad" / "adapter_config.json").read_text())
    except (OSError, ValueError):
        pass
    base_name = cfg.get("base_model_name_or_path")
    if bad:
        REC.add(8, "--model demo records its base as 'demo'", bad[0], bad[1], secs)
    else:
        REC.add(8, "--model demo records its base as 'demo'", "OK" if rc == 0 and base_name == "demo" else
                "silent-wrong", f"rc {rc}, base_model_name_or_path={base_name!r}", secs)
    hint = next((ln.split("try:", 1)[1].strip() for ln in (so + se).splitlines() if "try:" in ln and "generate" in ln),
                None)
    if hint is None:
        REC.add(8, "the printed 'sbd generate --model OUT' hint runs", "silent-wrong",
                f"no hint printed: {so.strip()[-200:]!r}")
        return
    argv = shlex.split(hint)
    argv = [a if a != "..." else "Add up: 3 + 4" for a in argv] + ["--max-new-tokens", "8"]
    argv[0] = SBD
    rc2, so2, se2, secs2 = run_cli(argv, w, 180)
    bad = cli_outcome(rc2, se2)
    REC.add(8, "the printed 'sbd generate --model OUT' hint runs", bad[0] if bad else
            ("OK" if rc2 == 0 else "silent-wrong"), f"{hint!r}: rc {rc2} {(bad or ('', ''))[1]} {se2.strip()[-150:]!r}",
            secs2)
    if not quick:
        other = work / "elsewhere"
        other.mkdir(exist_ok=True)
        argv3 = [SBD, "generate", "--model", str(w / "ad"), "--method", "sbd-verify", "Add up: 3 + 4",
                 "--max-new-tokens", "8"]
        rc3, so3, se3, secs3 = run_cli(argv3, other, 180)
        bad = cli_outcome(rc3, se3)
        REC.add(8, "sbd generate --model <adapter folder> from another directory", bad[0] if bad else
                ("OK" if rc3 == 0 else "silent-wrong"), f"rc {rc3}: {se3.strip()[-150:]!r}", secs3)


# ------------------------------------------------------------------------------------------------------ report

def machine() -> dict:
    cpu = ""
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import torch

    def git(*a):
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return {"cpu": cpu, "cores": os.cpu_count(), "load_average_at_start": list(os.getloadavg()),
            "python": platform.python_version(), "torch": torch.__version__, "openai": openai.__version__,
            "httpx": httpx.__version__, "platform": platform.platform(), "commit": git("rev-parse", "--short", "HEAD"),
            "commit_subject": git("log", "-1", "--format=%s")[:120],
            "uncommitted_files": len([ln for ln in git("status", "--short").splitlines() if ln.strip()])}


def report(out_dir: Path, info: dict, command: str, wall: float, quick: bool, setups: list[str]) -> str:
    res = sorted(REC.results, key=lambda r: (r.group, r.name))
    counts = {g: {o: 0 for o in OUTCOMES} for g in GROUPS}
    for r in res:
        counts[r.group][r.outcome] += 1
    total = {o: sum(counts[g][o] for g in GROUPS) for o in OUTCOMES}
    head = "| group | " + " | ".join(OUTCOMES) + " | probes |"
    rows = [head, "|---|" + "---:|" * (len(OUTCOMES) + 1)]
    for g, name in GROUPS.items():
        c = counts[g]
        rows.append(f"| {g}. {name} | " + " | ".join(str(c[o]) for o in OUTCOMES) + f" | {sum(c.values())} |")
    rows.append("| **all** | " + " | ".join(f"**{total[o]}**" for o in OUTCOMES) + f" | **{len(res)}** |")
    table = "\n".join(rows)
    bad = [r for r in res if r.outcome != "OK"]
    lines = [f"# Robustness probes{' (--quick)' if quick else ''}", "",
             f"Written by `{command}` (run from the repository root) on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{wall:.0f} s wall.", "",
             f"Machine: {info['cores']} cores ({info['cpu']}), load average at start "
             f"{', '.join(f'{x:.1f}' for x in info['load_average_at_start'])}; Python {info['python']}, torch "
             f"{info['torch']}, openai {info['openai']}, httpx {info['httpx']}; {info['platform']}.",
             f"Code: commit {info['commit']} ({info['commit_subject']}) with {info['uncommitted_files']} uncommitted "
             "files in the working tree (others were changing sbd/ while this ran).", "",
             "Outcomes: OK = the behaviour a user expects; silent-wrong = a wrong answer, status or body without a "
             "traceback (a parameter accepted and not honoured, an error not in OpenAI's shape, a slow /health, "
             "more than one line for a CLI mistake); traceback = a traceback on stderr or a 500 not in OpenAI's shape; "
             "data-loss = a user's file changed or records lost; hang = a timeout; crash = a signal exit or a server "
             "gone. Probes are written against what a user expects, so a feature not built yet is non-OK.", "",
             "Servers (TMP: the run's temp folder; demo-chat is a copy of the demo model whose tokenizer has a "
             "chat template, since the shipped one has none and every chat request to it is a 400):", ""]
    lines += [f"- `{c}`" for c in setups]
    lines += ["", "The CLI probes run `sbd distill --model demo --no-chat --threads 1`, `sbd train --model demo "
              "--adapter lora --steps 2` and `sbd generate` in temp folders (the read-only place and the full disk "
              "are tmpfs mounts); the answers are compared with `sbd.generate` run in the script's own process, and "
              "the logit processors also with a greedy loop written out in the script.", "",
              table, "", f"## Not OK ({len(bad)})", ""]
    lines += [f"- [{r.group}] **{r.name}** — {r.outcome}: {r.detail}" for r in bad] or ["(none)"]
    lines += ["", f"## Every probe ({len(res)})", "", "| group | probe | outcome | seconds | detail |", "|---|---|---|---:|---|"]
    lines += [f"| {r.group} | {r.name} | {r.outcome} | {r.seconds:.2f} | {r.detail[:160].replace('|', '/')} |"
              for r in res]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probes.md").write_text("\n".join(lines).replace("\n\n\n", "\n\n") + "\n")
    (out_dir / "probes.json").write_text(json.dumps({
        "command": command, "machine": info, "wall_seconds": round(wall, 1), "quick": quick,
        "counts": {str(g): counts[g] for g in GROUPS}, "total": total,
        "probes": [asdict(r) for r in res]}, indent=1) + "\n")
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small subset (about 80 probes)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "probes" / "results"),
                    help="folder for probes.md and probes.json")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (server logs) and print its path")
    a = ap.parse_args()
    command = "python benchmarks/probes/probes.py" + (" --quick" if a.quick else "") + \
        ("" if a.out == str(REPO / "benchmarks" / "probes" / "results") else f" --out {a.out}")
    t_start = time.monotonic()
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="sbd-probes-"))
    servers: list[Server] = []
    setups: list[str] = []
    try:
        chat_folder = make_chat_model(work)
        off = Offline(chat_folder)
        loader = threading.Thread(target=off.load)
        loader.start()
        # S1: the tester's server (demo), reachable beyond loopback without a key, big bodies read
        s1 = Server("s1-open", work, ["--max-body-bytes", str(32 << 20), "--max-prompt-tokens", "200"],
                    host="0.0.0.0")
        s1.served = "demo"
        # S2: --api-key, default limits
        s2 = Server("s2-key", work, ["--api-key", KEY])
        s2.needs_key, s2.served = True, "demo"
        # S3: SBD_API_KEY, the demo model with a chat template
        s3 = Server("s3-envkey-chat", work, ["--served-name", CHAT_NAME], model=str(chat_folder),
                    env={"SBD_API_KEY": KEY}, host="0.0.0.0")
        s3.needs_key, s3.served = True, CHAT_NAME
        servers = [s1, s2, s3]
        # the CLI groups run beside the server probes (one process at a time)
        cli = ThreadPoolExecutor(1)
        cli_done = cli.submit(lambda: train_probes(work, distill_probes(work, a.quick), a.quick))
        for s in servers:
            ok = s.wait_ready()
            print(f"{s.name}: {'ready' if ok else 'FAILED'} on port {s.port} "
                  f"({s.ready_s or 0:.0f} s)", flush=True)
            if not ok:
                print(s.stderr_all()[-2000:], file=sys.stderr)
                REC.add(9, f"{s.name} starts", "crash" if s.proc.poll() not in (None, 0, 1, 2) else "silent-wrong",
                        f"did not start: {s.stderr_all().strip()[-300:]!r}")
        setups.extend(" ".join(shlex.quote(str(c).replace(str(work), "TMP")) for c in
                               (["SBD_API_KEY=" + KEY] if s is s3 else []) + [Path(s.cmd[0]).name] + s.cmd[1:])
                      for s in servers)
        loader.join()
        if off.error:
            raise off.error

        def group(g: int, fn, *args, needs=()):
            """One group's probes; a group that cannot run (a server gone, a bug here) is one non-OK probe."""
            gone = [s.name for s in needs if not s.alive()]
            if gone:
                REC.add(g, f"group {g} skipped", "crash", f"server(s) {gone} not running")
                return
            try:
                fn(*args)
            except Exception as e:
                REC.add(g, f"group {g} aborted", "silent-wrong", f"probe error {type(e).__name__}: {e}")

        group(2, params, s1, s3, off, a.quick, needs=(s1, s3))
        group(4, mistakes, s1, s3, a.quick, needs=(s1, s3))
        group(6, auth, s2, s3, s1, off, a.quick, needs=(s1, s2, s3))
        group(9, minor, s1, s3, off, work, a.quick, needs=(s1, s3))
        try:
            cli_done.result()  # the CPU is quieter for the timing-sensitive groups
        except Exception as e:
            REC.add(7, "groups 7-8 aborted", "silent-wrong", f"probe error {type(e).__name__}: {e}")
        group(3, big_requests, s1, s2, off, a.quick, needs=(s1, s2))
        group(1, contamination, s1, off, [16] if a.quick else [40], needs=(s1,))
        group(5, ctrl_c, s1, 2, off, "s1", needs=(s1,))
        group(5, ctrl_c, s2, 1, off, "s2", needs=(s2,))
        if not a.quick:
            group(5, ctrl_c, s3, 2, off, "s3", True, needs=(s3,))
    finally:
        for s in servers:
            s.stop()
        for m in MOUNTS:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - t_start
    table = report(Path(a.out), info, command, wall, a.quick, setups)
    print()
    print(table)
    bad = [r for r in REC.results if r.outcome != "OK"]
    print(f"\n{len(REC.results)} probes, {len(bad)} not OK, {wall:.0f} s; {Path(a.out) / 'probes.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
