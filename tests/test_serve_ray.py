"""The server on Ray Serve with two local replicas: both come up, concurrent openai-client requests get
offline `sbd.generate`'s answers, and replicas that die mid-request give their clients an error, never a
wrong answer (Ray then brings them back, and they answer right again).

Ray installs with the test extra (`ray[serve]`); the cluster start takes a good part of a minute on 2
cores, so the whole module shares one cluster."""

import os
import signal
import socket
import threading
import time

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import sbd  # noqa: E402
from sbd.serving.app import ServerConfig  # noqa: E402
from sbd.serving.ray_app import application  # noqa: E402

PROMPTS = ["Q: 12 + 7 = ?", "Sort: d b a c", "Reverse the word: planet", "hello", "Add up: 3 + 4 + 5",
           "Count the letters in banana", "Q: 9 * 9 = ?", "Sort: 5 3 9 1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = application("demo", config=ServerConfig(model_name="demo", max_batch=4), threads=1, replicas=2)
        serve.run(app, name="sbd", route_prefix="/")
        _wait_running(2)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def offline():
    model, tokenizer = sbd.load("demo")
    return {p: sbd.generate(model, tokenizer, [p], max_new_tokens=24).texts[0] for p in PROMPTS}


def _wait_running(n: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while True:
        status = serve.status().applications["sbd"].deployments["sbd"]
        if status.replica_states.get("RUNNING", 0) == n and status.status == "HEALTHY":
            return
        assert time.time() < deadline, status
        time.sleep(0.5)


def _replica_pids() -> list[int]:
    """The process of each replica (asked of the replica actors themselves: no dashboard needed)."""
    pids = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if "REPLICA" in entry["name"].upper():
            actor = ray.get_actor(entry["name"], namespace=entry["namespace"])
            pids.append(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60))
    return pids


def _ask_until_routed(client, prompt: str, deadline: float):
    """The proxy may answer 503 for a moment while replicas (re)start: ask again until the deadline."""
    while True:
        try:
            return client.completions.create(model="demo", prompt=prompt, max_tokens=24)
        except (openai.APIStatusError, openai.APIConnectionError):
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def test_two_replicas_answer_concurrent_clients_with_offline_answers(cluster, offline):
    client = openai.OpenAI(base_url=cluster + "/v1", api_key="none", max_retries=0, timeout=120)
    got, errors = {}, []

    def ask(p):
        try:
            got[p] = _ask_until_routed(client, p, time.time() + 60).choices[0].text
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert got == offline
    assert len(_replica_pids()) == 2


def test_replicas_that_die_mid_request_give_errors_never_wrong_answers(cluster, offline):
    prompt = PROMPTS[0]
    model, tokenizer = sbd.load("demo")
    want = sbd.generate(model, tokenizer, [prompt], max_new_tokens=200).texts[0]
    results, streaming = [], threading.Event()

    def stream():
        body = {"model": "demo", "prompt": prompt, "max_tokens": 200, "stream": True}
        text, done = "", False
        try:
            with httpx.stream("POST", cluster + "/v1/completions", json=body, timeout=120) as r:
                if r.status_code != 200:
                    results.append(("error", r.status_code))
                    return
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        import json

                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            results.append(("error", chunk["error"]))
                            return
                        text += chunk["choices"][0]["text"]
                        streaming.set()
        except httpx.HTTPError as e:
            results.append(("error", repr(e)))
            return
        results.append(("answer", text) if done else ("error", "stream ended without [DONE]"))

    clients = [threading.Thread(target=stream) for _ in range(24)]  # 8 rows in all: most wait in a queue
    for c in clients:
        c.start()
    pids = _replica_pids()
    assert len(pids) == 2
    assert streaming.wait(timeout=120)  # mid-request: a first token has reached a client
    for pid in pids:  # both replicas die while the requests stream
        os.kill(pid, signal.SIGKILL)
    for c in clients:
        c.join(timeout=180)
    assert len(results) == 24
    for kind, value in results:
        assert kind == "error" or value == want, (kind, value)
    # Ray brings the replicas back, and they answer right again
    _wait_running(2)
    client = openai.OpenAI(base_url=cluster + "/v1", api_key="none", max_retries=0, timeout=120)
    assert _ask_until_routed(client, prompt, time.time() + 120).choices[0].text == offline[prompt]
