"""`sbd serve` with real clients on 127.0.0.1: the official `openai` package and raw HTTP against a live
uvicorn server over the shipped demo model. Every answer must equal offline `sbd.generate`."""

import concurrent.futures as cf
import copy
import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import uvicorn  # noqa: E402

import sbd  # noqa: E402
from sbd.serving.app import ServerConfig, create_app  # noqa: E402

TEMPLATE = "{% for m in messages %}<{{ m.role }}> {{ m.content }}\n{% endfor %}<assistant> "
PROMPTS = ["Q: 12 + 7 = ?", "Sort: d b a c", "Reverse the word: planet", "Count the letters in banana",
           "Q: 3 * 4 = ?", "hello"]


class LiveServer:
    def __init__(self, app):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def demo():
    model, tokenizer = sbd.load("demo")
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = TEMPLATE
    return model, tokenizer


@pytest.fixture(scope="module")
def live(demo):
    model, tokenizer = demo
    server = LiveServer(create_app(model, tokenizer, ServerConfig(model_name="demo", max_batch=8, max_queue=64)))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)


def offline(demo, prompt, chat=False, **kw):
    model, tokenizer = demo
    kw.setdefault("method", "sbd-verify")
    kw.setdefault("max_new_tokens", 24)
    return sbd.generate(model, tokenizer, [prompt], chat=chat, **kw)


def test_completions_equal_offline_generate(demo, client):
    for p in PROMPTS[:3]:
        got = client.completions.create(model="demo", prompt=p, max_tokens=24)
        want = offline(demo, p)
        assert got.choices[0].text == want.texts[0]
        assert got.usage.completion_tokens == len(want.token_ids[0])
        assert got.choices[0].finish_reason in ("stop", "length")


def test_chat_and_streaming_equal_offline_generate(demo, client):
    msgs = [{"role": "user", "content": PROMPTS[1]}]
    want = offline(demo, msgs, chat=True).texts[0]
    got = client.chat.completions.create(model="demo", messages=msgs, max_tokens=24)
    assert got.choices[0].message.content == want and got.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="demo", messages=msgs, max_tokens=24, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    text = "".join(c.choices[0].text for c in client.completions.create(model="demo", prompt=PROMPTS[2],
                                                                         max_tokens=24, stream=True))
    assert text == offline(demo, PROMPTS[2]).texts[0]


def test_sampling_with_a_seed_equals_offline(demo, client):
    got = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=20, temperature=0.8, seed=11)
    assert got.choices[0].text == offline(demo, PROMPTS[0], max_new_tokens=20, temperature=0.8, seed=11).texts[0]


def complete(url: str, body: dict, hang_up: bool = False) -> str | None:
    """One completions request over raw HTTP: the whole text, streamed or not as `body` says; with
    `hang_up`, the client closes the stream after its first event and gets None."""
    with httpx.Client(timeout=120) as h:
        if not body.get("stream"):
            r = h.post(url + "/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]
        text = ""
        with h.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if hang_up:
                    return None
                if line.startswith("data: ") and line != "data: [DONE]":
                    text += json.loads(line[6:])["choices"][0]["text"]
        return text


def test_32_concurrent_clients_get_their_own_answers(demo, live):
    """Different prompts, lengths, methods and stop strings at once: nothing lost or mixed up."""
    methods = [("sbd-verify", {}), ("ntp", {}), ("sbd", {"gamma": 0.35}), ("sbd", {"gamma": 0.0}),
               ("sbd-verify", {"draft": "adaptive"})]
    jobs = []
    for i in range(32):
        method, extra = methods[i % len(methods)]
        p = PROMPTS[i % len(PROMPTS)] + " " * (i % 3)
        stop = [" "] if i % 5 == 0 else None
        jobs.append((p, method, extra, 8 + 3 * i % 30, stop, i % 2 == 0))

    def ask(job):
        p, method, extra, n, stop, stream = job
        return complete(live.url, {"model": "demo", "prompt": p, "max_tokens": n, "method": method, "stop": stop,
                                   "stream": stream, **extra})

    with cf.ThreadPoolExecutor(32) as pool:
        got = list(pool.map(ask, jobs))
    for (p, method, extra, n, stop, _), text in zip(jobs, got):
        assert text == offline(demo, p, method=method, max_new_tokens=n, stop=stop, **extra).texts[0]


@pytest.mark.parametrize("prefill", ["separate", "mixed"])
def test_clients_hanging_up_mid_stream_leave_every_other_answer_intact(demo, prefill):
    """48 clients at once on 8 rows; every third streams and hangs up after its first event, so rows leave
    and others join between the same two steps. Every answer that completes equals offline."""
    model, tokenizer = demo
    server = LiveServer(create_app(model, tokenizer, ServerConfig(model_name="demo", max_batch=8, max_queue=64,
                                                                  prefill=prefill)))
    methods = [("sbd-verify", {}), ("ntp", {}), ("sbd", {"gamma": 0.35}), ("sbd-verify", {"draft": "block"})]
    jobs = [(PROMPTS[i % len(PROMPTS)] + " " * (i % 4), *methods[i % len(methods)], 6 + 5 * i % 40, i % 3)
            for i in range(48)]

    def ask(job):
        p, method, extra, n, kind = job  # kind 0: hangs up; 1: streams to the end; 2: one response
        return complete(server.url, {"model": "demo", "prompt": p, "max_tokens": n, "method": method,
                                     "stream": kind != 2, **extra}, hang_up=kind == 0)

    try:
        with cf.ThreadPoolExecutor(48) as pool:
            got = list(pool.map(ask, jobs))
    finally:
        server.stop()
    completed = [(job, text) for job, text in zip(jobs, got) if text is not None]
    assert len(completed) == 32
    wrong = [job[0] for job, text in completed
             if text != offline(demo, job[0], method=job[1], max_new_tokens=job[3], **job[2]).texts[0]]
    assert not wrong, f"{len(wrong)} of {len(completed)} answers differ from offline"


def test_a_client_that_disconnects_frees_its_row(live, client):
    body = {"model": "demo", "prompt": PROMPTS[0], "max_tokens": 200, "stream": True, "method": "ntp"}
    with httpx.Client(timeout=60) as h:
        with h.stream("POST", live.url + "/v1/completions", json=body) as r:
            next(r.iter_lines())  # one event, then hang up
    deadline = time.time() + 20
    while httpx.get(live.url + "/health").json()["running"] and time.time() < deadline:
        time.sleep(0.1)
    assert httpx.get(live.url + "/health").json()["running"] == 0
    assert client.completions.create(model="demo", prompt="hi", max_tokens=4).choices[0].text is not None


@pytest.mark.parametrize("body,status,param", [
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10 ** 6}, 400, "max_tokens"),
    ({"prompt": "x", "method": "fast"}, 400, "method"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "n": 1000}, 400, "n"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "block_size": 1000}, 400, "block_size"),
    ({"prompt": "x", "draft": "eb", "method": "sbd"}, 400, "draft"),
    ({"prompt": "x", "draft": "adaptive", "temperature": 0.7}, 400, "draft"),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [10 ** 7]}, 400, "prompt"),
    ({"prompt": "x", "model": "gpt-9"}, 404, "model"),
    ({"prompt": " ".join(str(i) for i in range(400)), "max_tokens": 8}, 400, None),
])
def test_malformed_requests_get_openai_shaped_errors(live, body, status, param):
    r = httpx.post(live.url + "/v1/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param:
        assert err["param"].startswith(param)


def test_invalid_json_and_bad_chat_messages(live, client):
    r = httpx.post(live.url + "/v1/completions", content=b"{bad", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # a parser's recursion limit, not a 500
    r = httpx.post(live.url + "/v1/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="demo", messages=[], max_tokens=4)


def test_models_health_and_metrics(live, client):
    assert [m.id for m in client.models.list()] == ["demo"]
    assert httpx.get(live.url + "/health").json()["status"] == "ok"
    text = httpx.get(live.url + "/metrics").text
    for name in ("sbd_requests_total", "sbd_queue_length", "sbd_tokens_per_forward", "sbd_draft_tokens_accepted_total",
                 "sbd_time_to_first_token_seconds", "sbd_tokens_per_second"):
        assert name in text


def test_a_full_queue_answers_429(demo):
    model, tokenizer = demo
    server = LiveServer(create_app(model, tokenizer, ServerConfig(model_name="demo", max_batch=1, max_queue=1)))
    try:
        body = {"prompt": PROMPTS[0], "max_tokens": 200, "method": "ntp"}
        with cf.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda _: httpx.post(server.url + "/v1/completions", json=body, timeout=120).status_code,
                                  range(6)))
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
    finally:
        server.stop()


def test_a_crashing_step_fails_its_requests_only(demo, monkeypatch):
    model, tokenizer = demo
    app = create_app(model, tokenizer, ServerConfig(model_name="demo"))
    server = LiveServer(app)
    try:
        worker = app.state.server.worker
        real = type(worker.engine).step
        calls = {"n": 0}

        def flaky(self):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("boom")
            return real(self)

        monkeypatch.setattr(type(worker.engine), "step", flaky)
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 8}, timeout=60)
        assert r.status_code == 500 and "boom" in r.json()["error"]["message"]
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 8}, timeout=60)
        assert r.status_code == 200
    finally:
        server.stop()
