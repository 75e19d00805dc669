"""`sbd serve --engine vllm`: vLLM's own OpenAI server with sbd's drafts, live, through the openai client.

Runs where vLLM's environment exists (`sbd vllm-setup`; CI makes it first), else skips saying so. On a
tiny random model with a random, non-zero drafting adapter (a gate leaking onto a committed position
would change its tokens): 16 concurrent requests of mixed lengths get exactly the model's own greedy
tokens (sbd's NTP decoding, equal to Hugging Face greedy elsewhere in the suite); a request dropped
mid-stream leaves no trace in the others or in the next one; no mask token is ever in an output or among
the logprobs. Also the plug-in's own checks (tests/vllm, run with vLLM's python), and the one-line
refusals, which need no vLLM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import sbd
from sbd.cli import main
from sbd.errors import SBDError

ROOT = Path(__file__).resolve().parent.parent


def _vllm_python():
    from sbd.integrations.vllm import environment

    try:
        return environment.check()
    except SBDError as e:
        return str(e)


@pytest.fixture(scope="module")
def vllm_python():
    found = _vllm_python()
    if isinstance(found, str):
        pytest.skip(f"vLLM's environment is not here: {found}")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The plug-in checks' tiny random Llama (head_dim 32: vLLM's CPU kernels crash on 16) and, in
    sbd_adapter/, its random non-zero drafting adapter; its output layer scaled so that logits are decisive
    (equal tokens then say the engines agree, not that float noise did)."""
    sys.path.insert(0, str(ROOT / "tests" / "vllm"))
    import make_tiny

    out = make_tiny.make(tmp_path_factory.mktemp("vllm_serve") / "tiny", seed=3)
    model, _ = sbd.load(str(out))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(30.0)
    model.save_pretrained(out)
    return out


def test_the_plugins_own_checks_pass_in_vllms_environment(vllm_python):
    from sbd.integrations.vllm.launch import cpu_environment

    env = dict(cpu_environment(1), SBD_TEST_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    done = subprocess.run([str(vllm_python), "-m", "pytest", "-p", "no:cacheprovider", "tests/vllm"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout[-2000:]


LOG = {}


@pytest.fixture(scope="module")
def server(vllm_python, folder):
    port = _free_port()
    log = open(folder.parent / "server.log", "w")
    LOG["path"] = folder.parent / "server.log"
    env = dict(os.environ, SBD_VLLM_VENV=str(Path(vllm_python).parent.parent), VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.Popen([sys.executable, "-m", "sbd.cli", "serve", "--engine", "vllm", "--model", str(folder),
                             "--adapter", str(folder / "sbd_adapter"), "--port", str(port), "--threads", "1",
                             "--served-name", "tiny", "--max-model-len", "512", "--", "--enforce-eager", "--dtype", "float32"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.time() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM's server exited: {_log_tail()}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "vLLM's server did not come up"
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _log_tail() -> str:
    lines = Path(LOG["path"]).read_text().splitlines()
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return "\n".join(errors[-15:] or lines[-30:])


@pytest.fixture(scope="module")
def offline(folder):
    model, tokenizer = sbd.load(str(folder))

    def greedy(ids, n):
        return sbd.generate(model, tokenizer, [ids], method="ntp", max_new_tokens=n, eos_token_ids=[]).token_ids[0]
    return tokenizer, greedy


def _prompts(tokenizer):
    texts = ["the cat sat on the mat", "one two three one two three", "hello", "a b c d e f g h",
             "set block decoding writes several tokens", "the quick brown fox jumps over the lazy dog"]
    ids = [tokenizer(t).input_ids for t in texts]
    return [(ids[i % len(ids)], 8 + 5 * i) for i in range(16)]  # mixed prompt and answer lengths


def test_sixteen_concurrent_requests_get_the_models_own_greedy_tokens(server, offline, folder):
    import openai

    tokenizer, greedy = offline
    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=300)
    mask = int(sbd.load(str(folder))[0].config.sbd_mask_token_id)
    got, errors = {}, []

    def ask(i, ids, n):
        try:
            r = client.completions.create(model="tiny", prompt=ids, max_tokens=n, temperature=0, logprobs=5,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
            got[i] = r.choices[0]
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    jobs = _prompts(tokenizer)
    threads = [threading.Thread(target=ask, args=(i, ids, n)) for i, (ids, n) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, (errors[:2], _log_tail())
    mask_text = tokenizer.convert_ids_to_tokens(mask)
    for i, (ids, n) in enumerate(jobs):
        choice = got[i]
        assert list(choice.token_ids) == greedy(ids, n), i
        assert mask not in choice.token_ids
        for alternatives in choice.logprobs.top_logprobs:  # the mask is never among the most likely
            assert mask_text not in alternatives


def test_a_request_dropped_mid_stream_leaves_no_trace(server, offline):
    import httpx

    tokenizer, greedy = offline
    (ids, _), (other, _) = _prompts(tokenizer)[:2]
    body = {"model": "tiny", "prompt": ids, "max_tokens": 200, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for n, _ in enumerate(r.iter_lines()):
            if n >= 3:
                break  # the client leaves with drafts and masks in flight
    for prompt in (other, ids):
        r = httpx.post(server + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 40,
                                                         "temperature": 0, "ignore_eos": True,
                                                         "return_token_ids": True}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == greedy(prompt, 40)


def test_refusals_are_one_line_without_vllm(capsys, folder, tmp_path, monkeypatch):
    monkeypatch.setenv("SBD_VLLM_VENV", str(tmp_path / "none"))
    capsys.readouterr()
    assert main(["serve", "--engine", "vllm", "--model", str(folder)]) == 2
    assert "vLLM's environment is not set up" in capsys.readouterr().err
    assert main(["serve", "--engine", "vllm", "--model", str(folder), "--replicas", "2"]) == 2
    assert "--replicas apply to --engine sbd" in capsys.readouterr().err
    from sbd.integrations.vllm import launch

    with pytest.raises(SBDError, match="carries no drafting adapter"):
        launch.engine_settings("demo")
    settings = launch.engine_settings(str(folder))  # its own sbd_adapter/
    assert settings["hf_overrides"]["sbd_adapter"] == str((folder / "sbd_adapter").resolve())
    assert settings["hf_overrides"]["architectures"] == ["SBDLlamaForCausalLM"]
    assert settings["speculative_config"]["model"] == launch.PROPOSER
