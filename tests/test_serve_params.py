"""Every OpenAI parameter `sbd serve` takes is honoured exactly (the answer equals offline `sbd.generate`
with the same settings) or refused with a 400 in OpenAI's error shape that names it."""

import json

import pytest

import sbd

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_serve import PROMPTS, LiveServer, demo, offline  # noqa: E402,F401  (demo: the fixture)

from sbd.serving.app import ServerConfig, create_app  # noqa: E402


@pytest.fixture(scope="module")
def live(demo):  # noqa: F811
    model, tokenizer = demo
    server = LiveServer(create_app(model, tokenizer, ServerConfig(model_name="demo", max_batch=8)))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)


def many(demo, prompts, chat=False, **kw):  # noqa: F811
    """Offline `sbd.generate` of several prompts in one call (row i samples with seed + i)."""
    model, tokenizer = demo
    return sbd.generate(model, tokenizer, prompts, chat=chat, method="sbd-verify", **kw)


def _post(live, path, body):
    return httpx.post(live.url + path, json=body, timeout=120)


def _stream(live, path, body) -> list[dict]:
    chunks = []
    with httpx.stream("POST", live.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_n_choices_greedy_and_seeded_equal_offline(demo, client):  # noqa: F811
    got = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=16, n=3)
    want = offline(demo, PROMPTS[0], max_new_tokens=16).texts[0]
    assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == [want] * 3
    got = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=16, n=3, temperature=0.9, seed=5)
    want = many(demo, [PROMPTS[0]] * 3, max_new_tokens=16, temperature=0.9, seed=5).texts
    assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == want
    assert len(set(want)) > 1  # row i samples with seed + i
    assert got.usage.completion_tokens == sum(len(t) for t in many(
        demo, [PROMPTS[0]] * 3, max_new_tokens=16, temperature=0.9, seed=5).token_ids)


def test_n_choices_stream_by_index(demo, live):  # noqa: F811
    chunks = _stream(live, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[1]}],
                                                    "max_tokens": 16, "n": 2, "temperature": 0.8, "seed": 3})
    texts = ["", ""]
    for c in chunks:
        texts[c["choices"][0]["index"]] += c["choices"][0]["delta"].get("content") or ""
    msgs = [{"role": "user", "content": PROMPTS[1]}]
    assert texts == many(demo, [msgs, msgs], chat=True, max_new_tokens=16, temperature=0.8, seed=3).texts
    assert "usage" in chunks[-1]


def test_echo_puts_the_prompt_before_the_completion(demo, live, client):  # noqa: F811
    got = client.completions.create(model="demo", prompt=PROMPTS[2], max_tokens=12, echo=True)
    assert got.choices[0].text == PROMPTS[2] + offline(demo, PROMPTS[2], max_new_tokens=12).texts[0]
    chunks = _stream(live, "/v1/completions", {"prompt": PROMPTS[2], "max_tokens": 12, "echo": True})
    assert "".join(c["choices"][0]["text"] for c in chunks) == got.choices[0].text


@pytest.mark.parametrize("method", ["sbd-verify", "ntp"])
def test_completion_logprobs_equal_offline(demo, live, client, method):  # noqa: F811
    tokenizer = demo[1]
    want = offline(demo, PROMPTS[0], max_new_tokens=12, method=method, logprobs=3)
    got = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=12, logprobs=3,
                                    extra_body={"method": method})
    lp = got.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([e[1] for e in want.logprobs[0]], abs=1e-4)  # fp32, other widths
    assert lp.tokens == [tokenizer.decode([e[0]]) for e in want.logprobs[0]]
    for top, (tok, logprob, alts) in zip(lp.top_logprobs, want.logprobs[0]):
        assert top == pytest.approx({tokenizer.decode([t]): v for t, v in alts + [(tok, logprob)]}, abs=1e-4)
    zero = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=12, logprobs=0,
                                     extra_body={"method": method}).choices[0].logprobs
    # drafts follow the step costs the server learns as it runs, so the second call's forwards may be other
    # widths: the same tokens, float32 logprobs equal to rounding
    assert zero.token_logprobs == pytest.approx(lp.token_logprobs, abs=1e-5) and all(len(t) == 1 for t in zero.top_logprobs)
    chunks = _stream(live, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 12, "logprobs": 3,
                                               "method": method})
    streamed = [x for c in chunks if c["choices"][0]["logprobs"] for x in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)  # another call: other widths maybe (above)


def test_chat_logprobs_and_top_logprobs_equal_offline(demo, client):  # noqa: F811
    msgs = [{"role": "user", "content": PROMPTS[3]}]
    want = offline(demo, msgs, chat=True, max_new_tokens=10, logprobs=2)
    got = client.chat.completions.create(model="demo", messages=msgs, max_tokens=10, logprobs=True, top_logprobs=2)
    content = got.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([e[1] for e in want.logprobs[0]], abs=1e-4)
    for c, (_, _, alts) in zip(content, want.logprobs[0]):
        assert [a.token for a in c.top_logprobs] == [demo[1].decode([t]) for t, _ in alts]
        assert [a.logprob for a in c.top_logprobs] == pytest.approx([v for _, v in alts], abs=1e-4)
    assert got.choices[0].message.content == want.texts[0]
    plain = client.chat.completions.create(model="demo", messages=msgs, max_tokens=10, logprobs=True)
    assert [c.logprob for c in plain.choices[0].logprobs.content] == pytest.approx([e[1] for e in want.logprobs[0]],
                                                                                    abs=1e-4)
    assert all(c.top_logprobs == [] for c in plain.choices[0].logprobs.content)


def test_logprobs_cover_exactly_the_tokens_of_the_returned_text(demo, live):  # noqa: F811
    """An end token is not in the text, so not in the logprobs either; nor is a token that only made a stop
    string appear. Completions and chat, whole and streamed, alike."""
    model, tokenizer = demo
    prompt = "Add up: 12 + 7 - 3 + 45\n"  # the demo model answers, then writes its end token
    for path, body, chat in (("/v1/completions", {"prompt": prompt, "logprobs": 1}, False),
                             ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                       "logprobs": True, "top_logprobs": 1}, True)):
        want = offline(demo, body["messages"] if chat else prompt, chat=chat, max_new_tokens=64, logprobs=1)
        assert want.token_ids[0][-1] == tokenizer.eos_token_id  # the row ended on its end token
        for stop in (None, ["\n"]):
            req = {**body, "max_tokens": 64, **({"stop": stop} if stop else {})}
            choice = _post(live, path, req).json()["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
            pieces = ([c["token"] for c in choice["logprobs"]["content"]] if chat else
                      choice["logprobs"]["tokens"])
            assert choice["finish_reason"] == "stop" and text and "".join(pieces) == text, (path, stop, pieces, text)
            if stop is None:
                assert len(pieces) == len(want.token_ids[0]) - 1  # all but the end token
            chunks = _stream(live, path, req)
            lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0].get("logprobs")]
            streamed = [x["token"] for lp in lps for x in lp["content"]] if chat else [x for lp in lps
                                                                                       for x in lp["tokens"]]
            assert streamed == pieces, (path, stop)
            if not chat:
                offsets = [x for lp in lps for x in lp["text_offset"]]
                assert offsets == choice["logprobs"]["text_offset"], (offsets, choice["logprobs"]["text_offset"])


@pytest.mark.parametrize("settings", [
    {"logit_bias": {"5": 100}},
    {"presence_penalty": 1.5},
    {"frequency_penalty": 2.0},
    {"presence_penalty": -1.0, "frequency_penalty": 0.5, "method": "ntp"},
    {"top_p": 0.5, "temperature": 0.9, "seed": 7, "method": "ntp"},
    {"top_p": 0.3, "temperature": 1.2, "seed": 4},
])
def test_processors_equal_offline(demo, live, settings):  # noqa: F811
    body = {"prompt": PROMPTS[4], "max_tokens": 24, **settings}
    r = _post(live, "/v1/completions", body)
    assert r.status_code == 200, r.text
    kw = {k: v for k, v in settings.items() if k != "logit_bias"}
    if "logit_bias" in settings:
        kw["logit_bias"] = {int(k): v for k, v in settings["logit_bias"].items()}
    want = offline(demo, PROMPTS[4], max_new_tokens=24, **kw)
    assert r.json()["choices"][0]["text"] == want.texts[0]
    if "logit_bias" in settings:  # and it did something
        assert want.token_ids[0] != offline(demo, PROMPTS[4], max_new_tokens=24).token_ids[0]


def test_lookup_equals_offline(demo, live):  # noqa: F811
    prompt = "abc abc abc abc abc"
    r = _post(live, "/v1/completions", {"prompt": prompt, "max_tokens": 20, "lookup": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == offline(demo, prompt, max_new_tokens=20, lookup=True).texts[0]


def test_chat_content_as_text_parts_is_joined(demo, client):  # noqa: F811
    parts = [{"type": "text", "text": "Sort:"}, {"type": "text", "text": "d b a c"}]
    got = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": parts}], max_tokens=12)
    want = offline(demo, [{"role": "user", "content": "Sort:\nd b a c"}], chat=True, max_new_tokens=12).texts[0]
    assert got.choices[0].message.content == want


@pytest.mark.parametrize("path,name,no_op,refused", [
    ("/v1/completions", "best_of", 1, 2),
    ("/v1/completions", "suffix", None, "end"),
    ("/v1/chat/completions", "response_format", {"type": "text"}, {"type": "json_object"}),
    ("/v1/chat/completions", "tool_choice", "none", "auto"),
    ("/v1/chat/completions", "function_call", "none", "auto"),
])
def test_a_no_op_value_passes_any_other_is_refused(demo, live, path, name, no_op, refused):  # noqa: F811
    chat = path.endswith("chat/completions")
    body = {"messages": [{"role": "user", "content": PROMPTS[0]}]} if chat else {"prompt": PROMPTS[0]}
    r = _post(live, path, {**body, "max_tokens": 8, name: no_op})
    assert r.status_code == 200, r.text
    got = r.json()["choices"][0]
    want = offline(demo, body["messages"] if chat else PROMPTS[0], chat=chat, max_new_tokens=8).texts[0]
    assert (got["message"]["content"] if chat else got["text"]) == want
    r = _post(live, path, {**body, "max_tokens": 8, name: refused})
    assert r.status_code == 400 and r.json()["error"]["param"] == name


def test_known_fields_pass_and_unknown_ones_are_refused(demo, live):  # noqa: F811
    body = {"prompt": PROMPTS[0], "max_tokens": 8, "user": "alice", "stream_options": {"include_usage": True}}
    chunks = _stream(live, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == offline(demo, PROMPTS[0], max_new_tokens=8).texts[0]
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    r = _post(live, "/v1/completions", {"prompt": PROMPTS[0], "max_token": 5})  # a typo no longer decodes 256
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_token"
    assert "max_token" in r.json()["error"]["message"]


def test_developer_is_system_and_other_roles_are_refused(demo, live):  # noqa: F811
    msgs = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    r = _post(live, "/v1/chat/completions", {"messages": msgs, "max_tokens": 6})
    assert r.status_code == 200
    want = offline(demo, [{"role": "system", "content": "Be brief."}, msgs[1]], chat=True, max_new_tokens=6)
    assert r.json()["choices"][0]["message"]["content"] == want.texts[0]
    r = _post(live, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 6})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"


COMPLETION_REFUSALS = [
    ({"max_token": 5}, "max_token"),
    ({"best_of": 3}, "best_of"),
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": 2, "echo": True}, "echo"),
    ({"lookup": "banana"}, "lookup"),
    ({"lookup": True, "temperature": 0.5}, "lookup"),
    ({"lookup": True, "method": "ntp"}, "lookup"),
    ({"seed": 2 ** 63, "temperature": 0.5}, "seed"),
    ({"seed": -(2 ** 64)}, "seed"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"5": 10}, "method": "sbd"}, "logit_bias"),
    ({"top_p": 0.5, "method": "sbd"}, "top_p"),
    ({"logprobs": 1, "method": "sbd"}, "logprobs"),
    ({"stop": ["a"] * 5}, "stop"),
    ({"stop": "x" * 300}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"max_tokens": 5.5}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"n": True}, "n"),
    ({"prompt": ["a", "b"]}, "prompt"),
]


@pytest.mark.parametrize("extra,param", COMPLETION_REFUSALS)
def test_completion_fields_refused_with_400_naming_them(live, extra, param):
    r = _post(live, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param and err["message"]


CHAT_REFUSALS = [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"parallel_tool_calls": True}, "parallel_tool_calls"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"echo": True}, "echo"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"max_tokens": 4, "max_completion_tokens": 5}, "max_completion_tokens"),
    ({"messages": [{"role": "tool", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages[0].name"),
    ({"messages": []}, "messages"),
]


@pytest.mark.parametrize("extra,param", CHAT_REFUSALS)
def test_chat_fields_refused_with_400_naming_them(live, extra, param):
    r = _post(live, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                             **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param and err["message"]


@pytest.mark.parametrize("path,raw,param", [
    ("/v1/completions", '{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", '{"prompt": "ab", "stop": ["\\udc00"]}', "stop"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages[0].content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     "messages[0].content"),
])
def test_lone_surrogates_are_a_400(live, path, raw, param):
    r = httpx.post(live.url + path, content=raw.encode(), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_routes_and_methods_that_do_not_exist_answer_in_openai_shape(live):
    for r, status in ((httpx.get(live.url + "/v1/nothing"), 404), (httpx.get(live.url + "/v1/completions"), 405),
                      (httpx.post(live.url + "/health"), 405), (httpx.post(live.url + "/v1/completions"), 400)):
        assert r.status_code == status
        assert set(r.json()) == {"error"} and r.json()["error"]["message"]


def test_anchored_plain_sbd_per_request_equals_offline(demo, client):  # noqa: F811
    """`anchor: true` with method sbd decodes as `sbd.generate(..., method="sbd", anchor=True)` does (and not
    as the paper's rule, which writes another text here)."""
    body = {"method": "sbd", "anchor": True, "gamma": 0.5}
    got = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=24, extra_body=body)
    want = offline(demo, PROMPTS[0], method="sbd", anchor=True, gamma=0.5).texts[0]
    paper = offline(demo, PROMPTS[0], method="sbd", gamma=0.5).texts[0]
    assert got.choices[0].text == want and want != paper
