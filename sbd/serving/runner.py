"""Running the app on uvicorn: the port is taken before anything else (a busy port is one line and a
non-zero exit, not a traceback after "serving…"), a warning when the server is reachable beyond this
machine without an API key, and Ctrl-C: the first lets running requests finish, the second fails them
after the step in flight and exits at once, with the engine thread ended before the process (never a
C++ abort); a third ends the process at once. Any of them exits with status 130."""

from __future__ import annotations

import errno
import ipaddress
import signal
import socket
import sys

from .. import interrupts
from ..errors import SBDError


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, or SBDError saying why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise SBDError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free; a listening one not
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        why = "the port is in use (another server?); choose another with --port" if e.errno == errno.EADDRINUSE \
            else e.strerror
        raise SBDError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: whatever it resolves to, it may be reachable
        return False


def warn_if_open(host: str, api_key: str | None) -> None:
    if not api_key and not is_loopback(host):
        print(f"sbd: warning: listening on {host} without --api-key: anyone who can reach this port can use the "
              "model (set --api-key or SBD_API_KEY)", file=sys.stderr, flush=True)


def run(app, sock: socket.socket, banner: str) -> None:
    """Serve `app` on the bound `sock` until Ctrl-C (see the module's docstring)."""
    import uvicorn

    worker = app.state.server.worker

    class Server(uvicorn.Server):
        signals: list[int] = []

        def handle_exit(self, sig, frame):  # not uvicorn's: it would re-raise the signal inside its loop
            self.signals.append(sig)
            if not self.should_exit:  # stop accepting; running requests finish
                self.should_exit = True
            elif sig == signal.SIGINT and not worker.aborting:  # the second Ctrl-C: fail them after this step,
                worker.stop(timeout=0, abort=True)  # so that their connections close and the shutdown goes on
            elif sig == signal.SIGINT:  # a third: stop waiting for anything (uvicorn's own forced exit would
                interrupts.exit_now()  # cancel the app's shutdown and log that as a traceback)

    interrupts.raise_if_interrupted()  # a Ctrl-C during the imports or the model's load, which a library swallowed
    host, port = sock.getsockname()[:2]
    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    print(banner, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        if signal.SIGINT in server.signals:
            interrupts.leaving()  # uvicorn handed Ctrl-C back: another one now ends the process at once
        worker.stop(timeout=60, abort=True)  # a no-op after a drain; otherwise ends the thread before exit
    if signal.SIGINT in server.signals:
        raise KeyboardInterrupt  # the CLI's "interrupted", exit status 130
