"""`sbd serve` as a process: a taken port is one line and a non-zero exit before "serving…"; Ctrl-C twice
with requests in flight exits promptly and cleanly (no C++ abort)."""

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ctrl_c_reaches_it() -> None:
    """In the child before it starts: Ctrl-C at its default, as in a terminal. A test run started as a
    background job inherits SIGINT ignored, and the command rightly ignores it then (as under nohup)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_reaches_it)


def _serve(port: int, *extra: str) -> subprocess.Popen:
    return _start([sys.executable, "-m", "sbd.cli", "serve", "--model", "demo", "--port", str(port), "--threads", "1",
                   *extra])


def test_a_taken_port_is_one_line_and_a_non_zero_exit_before_serving():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = _serve(taken.getsockname()[1])
        out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "serving" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "in use" in lines[0] and lines[0].startswith("sbd: error:")


def _wait_until_up(proc: subprocess.Popen, url: str, deadline: float) -> None:
    while True:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, "the server did not come up"
        time.sleep(0.2)


def _ask(url: str) -> None:
    body = {"prompt": "Q: 12 + 7 = ?", "max_tokens": 250, "method": "ntp", "stream": True}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                pass
    except httpx.HTTPError:
        pass


# The second and third Ctrl-C come `delay` seconds after the first ("end": once every client has its
# answer or its error, i.e. after the drain); with requests streaming and without. Whatever the timing,
# the process ends with status 130 and no traceback or C++ abort.
@pytest.mark.parametrize("in_flight", [True, False], ids=["requests", "idle"])
@pytest.mark.parametrize("delay", [0, 0.05, 0.3, 1, 3, "end"])
def test_ctrl_c_twice_and_thrice_exits_130_on_every_timing(delay, in_flight):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(port, "--max-batch", "4")
    try:
        deadline = time.time() + 300
        _wait_until_up(proc, url, deadline)
        clients = [threading.Thread(target=_ask, args=(url,), daemon=True) for _ in range(12 if in_flight else 0)]
        for c in clients:
            c.start()
        while in_flight and httpx.get(url + "/health", timeout=5).json()["running"] == 0:
            assert time.time() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        if delay == "end":
            for c in clients:
                c.join(timeout=120)
            proc.wait(timeout=120) if not in_flight else None
        else:
            time.sleep(delay)
        proc.send_signal(signal.SIGINT)  # a no-op once the process has ended
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "terminate called" not in err and "Traceback" not in err, err
    assert proc.returncode == 130, (proc.returncode, err)  # interrupted, as a shell expects
    assert "sbd: interrupted" in err


def test_the_first_ctrl_c_lets_running_requests_finish():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(port, "--max-batch", "4")
    answers = []

    def ask():
        body = {"prompt": "Q: 12 + 7 = ?", "max_tokens": 40, "method": "ntp"}
        answers.append(httpx.post(url + "/v1/completions", json=body, timeout=120))

    try:
        _wait_until_up(proc, url, time.time() + 300)
        client = threading.Thread(target=ask, daemon=True)
        client.start()
        while httpx.get(url + "/health", timeout=5).json()["running"] == 0 and client.is_alive():
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        client.join(timeout=120)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(answers) == 1 and answers[0].status_code == 200, answers
    assert answers[0].json()["choices"][0]["text"]
    assert proc.returncode == 130, (proc.returncode, err)


@pytest.mark.parametrize("delay", [0, 0.05, 0.3, 1])
def test_ctrl_c_during_the_imports_or_start_up_exits_130_without_a_traceback(delay):
    """A Ctrl-C `delay` seconds into the command (while torch and the CLI import, or the model loads): the
    console entry's own path, status 130 and one line, wherever it lands."""
    code = ("import os, signal, sys, threading\n"
            "from sbd import interrupts\n"
            "from sbd.console import main\n"
            "install = interrupts.install\n"
            "def install_and_arm():  # main()'s first step; the Ctrl-C is timed from there\n"
            "    install()\n"
            f"    threading.Timer({delay}, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
            "interrupts.install = install_and_arm\n"
            f"sys.exit(main(['serve', '--model', 'demo', '--port', '{_free_port()}', '--threads', '1']))\n")
    proc = _start([sys.executable, "-c", code])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "sbd: interrupted", err


def test_a_ctrl_c_a_library_swallowed_during_start_up_still_stops_the_server():
    """A library that catches every error (an import probe) can swallow the KeyboardInterrupt of a Ctrl-C
    that lands inside it; the server must still stop before it serves: status 130, one line. Here the
    model's load swallows it on purpose (before the fix, the server went on to serve)."""
    code = ("import os, signal, sys, time\n"
            "from sbd.console import main\n"
            "from sbd.models import loading\n"
            "real = loading.load\n"
            "def swallowing_load(*a, **k):\n"
            "    try:\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "        time.sleep(30)\n"
            "    except BaseException:\n"
            "        print('swallowed', file=sys.stderr, flush=True)\n"
            "    return real(*a, **k)\n"
            "loading.load = swallowing_load\n"
            f"sys.exit(main(['serve', '--model', 'demo', '--port', '{_free_port()}', '--threads', '1']))\n")
    proc = _start([sys.executable, "-c", code])
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "swallowed" in err and "serving" not in out, (out, err)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "sbd: interrupted", err
