"""What guards the server for many users: the API key, the body-size and prompt-token limits, tokenizing
off the event loop, and the warning when it listens beyond this machine without a key."""

import copy
import threading

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_serve import TEMPLATE, LiveServer, demo, offline  # noqa: E402,F401  (demo: the fixture)

from sbd.cli.main import build_parser  # noqa: E402
from sbd.cli.serve import config_from_args  # noqa: E402
from sbd.serving.app import ServerConfig, create_app  # noqa: E402
from sbd.serving.runner import warn_if_open  # noqa: E402

KEY = "sk-test-123"


class BlockingTokenizer:
    """The demo tokenizer, except that encoding a prompt that starts with BLOCK waits for `release`."""

    def __init__(self, tokenizer):
        self.inner, self.entered, self.release = tokenizer, threading.Event(), threading.Event()
        self.longest = 0

    def __call__(self, text, *a, **kw):
        self.longest = max(self.longest, len(text))
        if text.startswith("BLOCK"):
            self.entered.set()
            assert self.release.wait(60)
        return self.inner(text, *a, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def guarded(demo):  # noqa: F811
    model, tokenizer = demo
    blocking = BlockingTokenizer(copy.deepcopy(tokenizer))
    config = ServerConfig(model_name="demo", max_body_bytes=4000, max_prompt_tokens=50, api_key=KEY)
    server = LiveServer(create_app(model, blocking, config))
    server.tokenizer = blocking
    yield server
    server.stop()


def _headers(key=KEY):
    return {"Authorization": f"Bearer {key}"}


def test_the_api_key_is_checked_on_every_route_but_health(demo, guarded):  # noqa: F811
    good = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)
    got = good.completions.create(model="demo", prompt="Q: 3 * 4 = ?", max_tokens=8)
    assert got.choices[0].text == offline(demo, "Q: 3 * 4 = ?", max_new_tokens=8).texts[0]
    bad = openai.OpenAI(base_url=guarded.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="demo", prompt="hi", max_tokens=4)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    for path in ("/v1/models", "/metrics", "/v1/nothing"):
        r = httpx.get(guarded.url + path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(guarded.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                   headers=_headers("nope"))
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(guarded.url + "/health").status_code == 200
    assert httpx.get(guarded.url + "/metrics", headers=_headers()).status_code == 200


def test_the_api_key_comes_from_the_option_or_the_environment(demo, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SBD_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "--model", "demo"])
    assert config_from_args(args, demo[0]).api_key == "from-env"
    args = build_parser().parse_args(["serve", "--model", "demo", "--api-key", "from-option"])
    assert config_from_args(args, demo[0]).api_key == "from-option"
    monkeypatch.delenv("SBD_API_KEY")
    assert config_from_args(build_parser().parse_args(["serve", "--model", "demo"]), demo[0]).api_key is None


def test_listening_beyond_loopback_without_a_key_warns(capsys):
    warn_if_open("127.0.0.1", None)
    warn_if_open("::1", None)
    warn_if_open("0.0.0.0", KEY)
    assert capsys.readouterr().err == ""
    warn_if_open("0.0.0.0", None)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning" in err and "--api-key" in err


def test_a_body_over_the_limit_is_413_before_it_is_read(guarded):
    big = {"prompt": "x" * 5000, "max_tokens": 4}
    r = httpx.post(guarded.url + "/v1/completions", json=big, headers=_headers())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b"x" * 1000

    r = httpx.post(guarded.url + "/v1/completions", content=chunks(),
                   headers={**_headers(), "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("prompt", ["a " * 60, list(range(3, 63))])
def test_a_prompt_over_the_token_limit_is_400(guarded, prompt):
    r = httpx.post(guarded.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}, headers=_headers())
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt" and "at most 50" in err["message"]
    msgs = [{"role": "user", "content": "a " * 60}]
    r = httpx.post(guarded.url + "/v1/chat/completions", json={"messages": msgs}, headers=_headers())
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_a_text_too_long_for_any_tokenization_is_refused_untokenized(guarded):
    longest = max(len(k) for k in guarded.tokenizer.get_vocab())
    text = "a" * (4 * longest * 51 + 1)  # no tokenization of it fits 50 tokens
    r = httpx.post(guarded.url + "/v1/completions", json={"prompt": text, "max_tokens": 4}, headers=_headers())
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert guarded.tokenizer.longest < len(text)


def test_tokenizing_does_not_hold_up_other_requests(guarded):
    tok = guarded.tokenizer
    result = {}
    t = threading.Thread(target=lambda: result.update(r=httpx.post(
        guarded.url + "/v1/completions", json={"prompt": "BLOCK me", "max_tokens": 4}, headers=_headers(),
        timeout=60)))
    t.start()
    try:
        assert tok.entered.wait(30)
        # the tokenizer is stuck in that request; the event loop is not
        assert httpx.get(guarded.url + "/health", timeout=10).json()["status"] == "ok"
        r = httpx.post(guarded.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=_headers(),
                       timeout=30)
        assert r.status_code == 200
    finally:
        tok.release.set()
        t.join(60)
    assert result["r"].status_code == 200


def test_parsing_a_body_does_not_hold_up_other_requests(demo, monkeypatch):  # noqa: F811
    """A large JSON body is parsed and validated off the event loop: while one is being parsed (here: held
    on purpose), /health and other requests still answer."""
    from sbd.serving import protocol as P

    entered, release = threading.Event(), threading.Event()
    validate = P.CompletionRequest.model_validate.__func__

    def slow(cls, obj, *a, **kw):
        if isinstance(obj, dict) and obj.get("prompt") == "PARSE-SLOWLY":
            entered.set()
            assert release.wait(60)
        return validate(cls, obj, *a, **kw)

    monkeypatch.setattr(P.CompletionRequest, "model_validate", classmethod(slow))
    model, tokenizer = demo
    server = LiveServer(create_app(model, tokenizer, ServerConfig(model_name="demo")))
    result = {}
    t = threading.Thread(target=lambda: result.update(r=httpx.post(
        server.url + "/v1/completions", json={"prompt": "PARSE-SLOWLY", "max_tokens": 2}, timeout=60)))
    t.start()
    try:
        assert entered.wait(30)
        assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200
    finally:
        release.set()
        t.join(60)
        server.stop()
    assert result["r"].status_code == 200
