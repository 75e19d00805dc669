"""Progress of long commands (the demos) on stderr: off a terminal, a line at most every few seconds and
one at the end, so that a log shows a slow machine working without one line per answer."""

from sbd.cli import show


def test_off_a_terminal_progress_prints_at_its_interval_and_at_the_end(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr("time.monotonic", lambda: now[0])
    p = show.Progress(5, "decoding", every=5.0)
    for t in (1.0, 2.0, 6.0, 7.0, 8.0):
        now[0] = t
        p.update(" ok")
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["sbd: decoding: 3/5 (6 s) ok", "sbd: decoding: 5/5 (8 s) ok"]
