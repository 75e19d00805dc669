"""`--resume` after damage, as a user meets it: a truncated or garbled newest checkpoint is named in one
line and passed over for the newest intact one (full-weight and adapter runs alike); all damaged is a
one-line refusal; a torn metrics line is dropped with a note; a garbled sbd_train.json is named."""

from __future__ import annotations

import json
import shutil

import pytest

from sbd.cli import main
from sbd.models import tiny

TEXTS = [" ".join(str(i) for i in range(s, s + 7)) for s in range(16)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished 4-step run with checkpoints 2 and 4, for each kind; tests damage copies of it."""
    root = tmp_path_factory.mktemp("damaged")
    tiny.create(root / "model", texts=TEXTS, vocab_size=200, hidden=32, layers=2, heads=4, kv_heads=2, context=64)
    (root / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    for kind, extra in (("full", []), ("adapter", ["--adapter", "lora", "--rank", "4"])):
        assert main(_argv(root, root / kind, extra)) == 0
    return root


def _argv(root, out, extra=(), resume=False):
    return ["train", "--model", str(root / "model"), "--data", str(root / "d.jsonl"), "--out", str(out),
            "--steps", "4", "--batch-size", "4", "--save-steps", "2", "--logging-steps", "1", "--save-total-limit", "0",
            "--no-progress", *extra, *(["--resume"] if resume else [])]


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


DAMAGE = {
    "truncated weights": (lambda c: _truncate(c / ("model.safetensors" if (c / "model.safetensors").exists()
                                                  else "adapter_model.safetensors")), "is truncated"),
    "truncated optimizer": (lambda c: _truncate(c / "optimizer.pt"), "optimizer.pt is truncated"),
    "missing state": (lambda c: (c / "trainer_state.json").unlink(), "no trainer_state.json"),
    "garbage state": (lambda c: (c / "trainer_state.json").write_text("{not json"), "not valid JSON"),
    "empty folder": (lambda c: [p.unlink() for p in c.iterdir() if p.is_file()], "no trainer_state.json"),
}


@pytest.mark.parametrize("kind", ["full", "adapter"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_newest_checkpoint_is_named_and_passed_over(runs, tmp_path, capsys, kind, damage):
    run = tmp_path / kind
    shutil.copytree(runs / kind, run)
    for name in ("model.safetensors", "adapter_model.safetensors"):
        (run / name).unlink(missing_ok=True)  # the run "did not finish"
    act, words = DAMAGE[damage]
    act(run / "checkpoint-4")
    extra = ["--adapter", "lora", "--rank", "4"] if kind == "adapter" else []
    capsys.readouterr()
    assert main(_argv(runs, run, extra, resume=True)) == 0
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if "damaged" in ln]
    assert len(line) == 1 and "checkpoint-4" in line[0] and words in line[0] and "checkpoint-2" in line[0]
    assert "Traceback" not in err
    assert (run / "checkpoint-4" / "trainer_state.json").is_file()  # redone from step 2


def test_every_checkpoint_damaged_is_a_one_line_refusal(runs, tmp_path, capsys):
    run = tmp_path / "full"
    shutil.copytree(runs / "full", run)
    for c in ("checkpoint-2", "checkpoint-4"):
        _truncate(run / c / "model.safetensors")
    assert main(_argv(runs, run, resume=True)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sbd: error: --resume: every checkpoint") and "\n" not in err


def test_torn_metrics_line_is_dropped_with_a_note(runs, tmp_path, capsys):
    run = tmp_path / "full"
    shutil.copytree(runs / "full", run)
    shutil.rmtree(run / "checkpoint-4")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')
    assert main(_argv(runs, run, resume=True)) == 0
    assert "dropped 1 unreadable line" in capsys.readouterr().err
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]


def test_garbled_run_file_is_named(runs, tmp_path, capsys):
    run = tmp_path / "full"
    shutil.copytree(runs / "full", run)
    (run / "sbd_train.json").write_text("\x00garbage")
    assert main(_argv(runs, run, resume=True)) == 2
    assert "sbd_train.json is damaged" in capsys.readouterr().err
