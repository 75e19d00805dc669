"""Ctrl-C for the `sbd` command: the first one stops what runs (a KeyboardInterrupt, which the command
turns into "sbd: interrupted" and exit status 130); once the command is leaving, any further Ctrl-C ends
the process at once with the same status, never with a traceback or death by the signal.

Python alone does not hold that on every timing: a KeyboardInterrupt that escapes (during the imports,
during a shutdown) prints a traceback and kills the process by SIGINT, and at interpreter shutdown the
handler falls back to the default, so a late Ctrl-C kills the process too. `install` replaces Python's
handler before anything heavy is imported; `leaving` marks the process as on its way out; `exit_now`
ends it without the interpreter's shutdown (which could wait on, or abort inside, a worker thread).

Only the command line installs this: a library caller keeps Python's own handler.
"""

from __future__ import annotations

import os
import signal
import sys

STATUS = 130  # what a shell expects of a process ended by Ctrl-C
TERM_STATUS = 143  # 128 + SIGTERM: what a scheduler expects of a process that its SIGTERM ended
_state = {"installed": False, "leaving": False}


class Terminated(KeyboardInterrupt):
    """A SIGTERM (what schedulers and `kill` send) that the work turned into a clean stop, as it turns a
    Ctrl-C: `sbd train` saves a checkpoint first. A KeyboardInterrupt, so that a caller who handles Ctrl-C
    handles it too; `sbd train` exits with TERM_STATUS on it."""


def _on_sigint(signum, frame) -> None:
    if _state["leaving"]:  # already on the way out: do not wait for anything
        exit_now()
    _state["leaving"] = True
    raise KeyboardInterrupt


def install() -> None:
    """Take over SIGINT in the main thread (a no-op elsewhere, and when Ctrl-C is ignored, as under nohup)."""
    try:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            return
        signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread
        return
    _state["installed"] = True


def installed() -> bool:
    return _state["installed"]


def interrupted() -> bool:
    """Whether a Ctrl-C has reached the command (an error raised after it is its consequence: a library
    may wrap the KeyboardInterrupt in an error of its own, as transformers' lazy imports do)."""
    return _state["leaving"]


def raise_if_interrupted() -> None:
    """Raise the KeyboardInterrupt of a Ctrl-C that a library swallowed (an import probe that catches every
    error reads an interrupted import as "not installed"): called before the command starts to wait on
    anything, so that the Ctrl-C still stops it."""
    if _state["leaving"]:
        raise KeyboardInterrupt


def leaving() -> None:
    """The command is on its way out because of Ctrl-C: from now on Ctrl-C ends the process at once."""
    _state["leaving"] = True
    if _state["installed"]:
        try:
            signal.signal(signal.SIGINT, _on_sigint)  # a library may have put another handler back
        except ValueError:
            pass


def exit_now(say: bool = True, status: int = STATUS) -> None:
    """End the process now with `status` (saying "interrupted" first, unless it was said), skipping the
    interpreter's shutdown: what the command wrote is flushed, its files were closed as the interrupt
    unwound it, and nothing is left to wait for."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a stream in the middle of a write (we may be inside it): lose its tail
            pass
    try:
        if say:
            os.write(2, b"sbd: interrupted\n")
    finally:
        os._exit(status)


def run_command(load, argv=None) -> int:
    """Run a command line under this Ctrl-C rule: `load()` imports and returns the command's `main(argv)`
    (imported only now, so that a Ctrl-C during the imports is caught too); its exit status, or 130."""
    try:
        install()
        main = load()
        raise_if_interrupted()  # the imports may have swallowed it
        status = main(argv)
    except KeyboardInterrupt:  # before the command's own guard (the imports) or after it
        exit_now()
    except BaseException:
        if interrupted():  # an error the interrupt caused, wrapped by a library: still an interrupt
            exit_now()
        raise
    if status == STATUS and installed():
        exit_now(say=False)  # the command said it; leave without waiting on anything
    return status
