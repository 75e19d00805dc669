"""vLLM's server as a child process that `sbd serve --engine vllm` watches: its output relayed, and Ctrl-C or
SIGTERM ending it within seconds whatever it is doing (starting, idle, streaming)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from ... import interrupts

GRACE_S = 10.0  # after Ctrl-C or SIGTERM, how long vLLM may take to stop before its processes are killed


def supervise(cmd: list[str], env: dict, url: str) -> int:
    """Run `cmd` (vLLM's server) in a process group of its own, relaying its output; the exit status.

    The terminal's Ctrl-C reaches this process only (the child has its own session), which then asks vLLM to
    stop (SIGTERM to its group: the API server and the engine) and, if it has not stopped after GRACE_S
    seconds (an open stream holds uvicorn's shutdown, a start-up cannot be cut short), kills the group. A
    second Ctrl-C kills it at once. What vLLM prints while it stops (tracebacks of the interrupted start-up,
    leak warnings) is not relayed: the user asked it to stop."""
    def orphan_guard():  # the child: its own session, and SIGTERM when this process dies (even by SIGKILL)
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001 (not Linux: the group is still killed on every exit path here)
            pass

    def relay(stream, fd: int) -> None:
        for line in iter(stream.readline, b""):
            if stopping.is_set():
                continue
            os.write(fd, line)
            if b"Application startup complete" in line:
                os.write(2, f"sbd: vLLM is ready on {url} after {time.monotonic() - started:.0f} s; Ctrl-C "
                            "stops it\n".encode())
        stream.close()

    started, stopping, signals, child = time.monotonic(), threading.Event(), [], []

    def kill_group(sig) -> None:
        try:
            if child:
                os.killpg(child[0].pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def on_signal(sig, frame) -> None:
        signals.append(sig)
        if len(signals) == 1:
            stopping.set()
            os.write(2, b"sbd: stopping vLLM (Ctrl-C again to stop it at once)\n")
            kill_group(signal.SIGTERM)
        else:  # the second signal: no waiting
            kill_group(signal.SIGKILL)
            interrupts.exit_now(say=False, status=interrupts.STATUS if sig == signal.SIGINT else interrupts.TERM_STATUS)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=orphan_guard)
    child.append(proc)
    if signals:  # a signal while it was being started
        kill_group(signal.SIGTERM)
    relays = [threading.Thread(target=relay, args=(proc.stdout, 1), daemon=True),
              threading.Thread(target=relay, args=(proc.stderr, 2), daemon=True)]
    for t in relays:
        t.start()
    try:
        deadline = None
        while proc.poll() is None:
            if signals and deadline is None:
                deadline = time.monotonic() + GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                kill_group(signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.1)
    finally:
        kill_group(signal.SIGKILL)  # whatever vLLM left in its group (its engine core) goes with it
    for t in relays:
        t.join(timeout=2)
    if signals:
        print("sbd: vLLM stopped", file=sys.stderr, flush=True)
        return interrupts.STATUS if signals[0] == signal.SIGINT else interrupts.TERM_STATUS
    code = proc.returncode
    return 128 - code if code < 0 else code
