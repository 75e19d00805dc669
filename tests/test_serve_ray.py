"""The server on Ray Serve with two local replicas: both come up, and answers equal offline `sbd.generate`.

Skipped where Ray is not installed (CI does not install it: Ray is a large download and its cluster
start takes a good part of a minute); run locally with `pip install "ray[serve]"`."""

import socket
import time

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

import sbd  # noqa: E402
from sbd.serving.app import ServerConfig  # noqa: E402
from sbd.serving.ray_app import application  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_replicas_serve_offline_answers():
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = application("demo", config=ServerConfig(model_name="demo", max_batch=4), threads=1, replicas=2)
        serve.run(app, name="sbd", route_prefix="/")
        status = serve.status().applications["sbd"].deployments["sbd"]
        assert status.replica_states.get("RUNNING") == 2
        model, tokenizer = sbd.load("demo")
        prompts = ["Q: 12 + 7 = ?", "Sort: d b a c", "Reverse the word: planet", "hello"] * 2
        deadline = time.time() + 60
        for p in prompts:
            while True:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                               json={"model": "demo", "prompt": p, "max_tokens": 16}, timeout=60)
                if r.status_code != 503 or time.time() > deadline:  # the proxy may need a moment
                    break
                time.sleep(0.5)
            assert r.status_code == 200, r.text
            want = sbd.generate(model, tokenizer, [p], method="sbd-verify", max_new_tokens=16).texts[0]
            assert r.json()["choices"][0]["text"] == want
    finally:
        serve.shutdown()
        ray.shutdown()
