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


def _serve(port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sbd.cli", "serve", "--model", "demo", "--port", str(port),
                             "--threads", "1", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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


def test_a_second_ctrl_c_with_requests_in_flight_exits_cleanly():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(port, "--max-batch", "4")
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the server did not come up"
            time.sleep(0.5)

        def ask():
            body = {"prompt": "Q: 12 + 7 = ?", "max_tokens": 250, "method": "ntp", "stream": True}
            try:
                with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                    for _ in r.iter_lines():
                        pass
            except httpx.HTTPError:
                pass

        clients = [threading.Thread(target=ask, daemon=True) for _ in range(12)]
        for c in clients:
            c.start()
        while httpx.get(url + "/health", timeout=5).json()["running"] == 0:
            assert time.time() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert proc.poll() is None  # the first Ctrl-C lets running requests finish
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "terminate called" not in err and "Traceback" not in err, err
    assert proc.returncode == 130, (proc.returncode, err)  # interrupted, as a shell expects
