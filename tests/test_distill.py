"""`sbd distill` never loses data: a foreign --out is refused untouched, the one rewrite (a torn last
line) is atomic, a resume must use the same prompts and settings (sources may be appended), an older
output is adopted only on request and after checking, and write failures are one line. Continuous
batching keeps every slot busy and gives exactly `generate(method="ntp")`'s tokens."""

from __future__ import annotations

import errno
import json
import os
import sys

import pytest
import torch

import sbd
from sbd.cli import main
from sbd.decoding import engine as engine_mod
from sbd.models import tiny
from sbd.training import distill as distill_mod
from sbd.training import distill_file

PROMPTS = ["count 1:", "the quick brown fox", "7 * 8 =", "Set block decoding reveals", "12 + 34 = 46. 7",
           "a", "100 - 1 = 99. The lazy dog jumps over", "fox"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    model, _ = tiny.create(root / "model", hidden=32, layers=2, heads=4, kv_heads=2, context=256, vocab_size=300)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(30.0)  # decisive logits: equal tokens mean something
    model.save_pretrained(root / "model")
    return root / "model"


@pytest.fixture
def files(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(PROMPTS[:3]) + "\n")
    b.write_text("\n".join(PROMPTS[3:5]) + "\n")
    return a, b


def _argv(model_dir, out, *sources, extra=()):
    argv = ["distill", "--model", str(model_dir), "--out", str(out), "--no-chat", "--max-new-tokens", "8",
            "--batch-size", "2", "--no-progress", *extra]
    for s in sources:
        argv += ["--prompts", str(s)]
    return argv


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert err.startswith("sbd: error:") and "\n" not in err and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


def _records(out):
    return sorted((json.loads(x) for x in out.read_text().splitlines()), key=lambda r: r["index"])


# -- continuous batching ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def varied(model_dir):
    """The model with an extra EOS that it often says, so that answers end at different lengths."""
    model, tok = sbd.load(model_dir)
    free = sbd.generate(model, tok, PROMPTS, method="ntp", max_new_tokens=16, eos_token_ids=[])
    counts = {}
    for row in free.token_ids:
        for t in set(row[1:12]):
            counts[t] = counts.get(t, 0) + 1
    stop = max(counts, key=counts.get)
    model.generation_config.eos_token_id = [tok.eos_token_id, stop]
    return model, tok


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_continuous_batching_keeps_rows_full_and_equals_generate(varied, tmp_path, monkeypatch, temperature):
    model, tok = varied
    seen = []  # (rows live, prompts added so far) at every step
    added = []
    step, add = engine_mod.Engine.step, engine_mod.Engine.add
    monkeypatch.setattr(engine_mod.Engine, "add", lambda self, row: (added.append(row), add(self, row))[1])
    monkeypatch.setattr(engine_mod.Engine, "step", lambda self: (seen.append((self.live, len(added))), step(self))[1])
    out = tmp_path / "d.jsonl"
    n = distill_mod.distill(model, tok, PROMPTS, out, chat=False, max_new_tokens=16, batch_size=3,
                            temperature=temperature, seed=7, progress=False, model_name="tiny")
    assert n == len(PROMPTS)
    recs = _records(out)
    assert [r["index"] for r in recs] == list(range(len(PROMPTS))) and {r["source"] for r in recs} == {"prompts"}
    for r, p in zip(recs, PROMPTS):
        ref = sbd.generate(model, tok, [p], method="ntp", max_new_tokens=16, temperature=temperature,
                           seed=7 + r["index"])
        assert r["completion_ids"] == ref.token_ids[0] and r["prompt_ids"] == tok(p).input_ids
    assert len({len(r["completion_ids"]) for r in recs}) > 2  # answers of different lengths
    waiting = [live for live, n_added in seen if n_added < len(PROMPTS)]
    assert waiting and all(live == 3 for live in waiting)  # no slot idles while prompts wait


# -- the output file ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["my notes\nabout the run\n",
                                     '{"prompt": "1 + 1", "completion": "2"}\n{"prompt": "2 + 2", "completion": "4"}\n',
                                     '{"index": 0, "prompt_ids": [1], "completion_ids": [2]}\nnot a record\n'])
def test_a_foreign_file_is_refused_untouched(model_dir, files, tmp_path, capsys, content):
    out = tmp_path / "train.jsonl"
    out.write_text(content)
    assert main(_argv(model_dir, out, files[0])) == 2
    _one_line_error(capsys, "not touching it")
    assert out.read_text() == content and not distill_file.meta_path(out).exists()
    assert main(_argv(model_dir, out, files[0], extra=["--adopt"])) == 2
    assert out.read_text() == content


def test_a_directory_as_out_is_one_line(model_dir, files, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for out in (tmp_path, ".", "/"):
        assert main(_argv(model_dir, out, files[0])) == 2
        _one_line_error(capsys, "is a folder")


def test_a_torn_last_line_is_dropped_atomically(model_dir, files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "d.jsonl"
    assert main(_argv(model_dir, out, files[0])) == 0
    recs = _records(out)
    lines = out.read_text().splitlines(keepends=True)
    torn = "".join(lines[:2]) + lines[2][:25]  # killed while appending the third record
    out.write_text(torn)

    def killed(src, dst):
        raise RuntimeError("killed between the temp file and the rename")
    monkeypatch.setattr(distill_file, "_replace", killed)
    with pytest.raises(RuntimeError):
        main(_argv(model_dir, out, files[0]))
    assert out.read_text() == torn  # the original is intact
    monkeypatch.undo()
    capsys.readouterr()
    assert main(_argv(model_dir, out, files[0])) == 0
    assert "distilled 1 new" in capsys.readouterr().out
    assert _records(out) == recs
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left
    out.write_text(lines[0][:5])  # killed in the first bytes of the first record
    assert main(_argv(model_dir, out, files[0])) == 0
    assert _records(out) == recs
    out.write_text("")  # killed before the first record
    assert main(_argv(model_dir, out, files[0])) == 0
    assert _records(out) == recs


def test_resume_with_other_settings_or_prompts_is_refused(model_dir, files, tmp_path, capsys):
    a, b = files
    out = tmp_path / "d.jsonl"
    assert main(_argv(model_dir, out, a)) == 0
    before = out.read_bytes()
    meta = distill_file.meta_path(out).read_bytes()
    argv = _argv(model_dir, out, a)
    argv[argv.index("--max-new-tokens") + 1] = "16"
    cases = [(argv, "max_new_tokens 16 != 8 recorded in"),
             ([x for x in _argv(model_dir, out, a) if x != "--no-chat"], "chat True != False recorded in"),
             (_argv(model_dir, out, a, extra=["--temperature", "0.5"]), "temperature 0.5 != 0.0"),
             (_argv(model_dir, out, b), "2 prompts != 3 recorded in"),
             (_argv(model_dir, out, b, a), "differ from those of source 1")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        _one_line_error(capsys, message, "d.jsonl.meta.json")
    a.write_text("\n".join(PROMPTS[:2] + PROMPTS[5:6]) + "\n")  # the file changed under the same name
    assert main(_argv(model_dir, out, a, b)) == 2
    _one_line_error(capsys, "prompts 0-2 differ from those of source 1")
    assert out.read_bytes() == before and distill_file.meta_path(out).read_bytes() == meta


def test_appended_sources_resume(model_dir, files, tmp_path, capsys):
    a, b = files
    out = tmp_path / "d.jsonl"
    assert main(_argv(model_dir, out, a)) == 0
    first = _records(out)
    assert main(_argv(model_dir, out, a, b, extra=["--batch-size", "3"])) == 0
    assert "distilled 2 new completions" in capsys.readouterr().out
    recs = _records(out)
    assert recs[:3] == first and [r["index"] for r in recs] == [0, 1, 2, 3, 4]
    assert [r["source"] for r in recs] == [str(a)] * 3 + [str(b)] * 2
    meta = json.loads(distill_file.meta_path(out).read_text())
    assert meta["prompts"] == 5 and [s["source"] for s in meta["sources"]] == [str(a), str(b)]
    assert meta["model"] == str(model_dir) and meta["max_new_tokens"] == 8 and meta["chat"] is False
    assert main(_argv(model_dir, out, a, b)) == 0
    assert "distilled 0 new" in capsys.readouterr().out


def test_an_older_output_is_adopted_only_on_request_and_after_checking(model_dir, files, tmp_path, capsys):
    a, b = files
    out = tmp_path / "d.jsonl"
    assert main(_argv(model_dir, out, a)) == 0
    legacy = [{k: v for k, v in r.items() if k != "source"} for r in _records(out)][:2]
    text = "".join(json.dumps(r) + "\n" for r in legacy)
    out.write_text(text)
    distill_file.meta_path(out).unlink()
    assert main(_argv(model_dir, out, a)) == 2
    _one_line_error(capsys, "--adopt")
    assert main(_argv(model_dir, out, b, extra=["--adopt"])) == 2  # other prompts
    _one_line_error(capsys, "not adopted")
    assert out.read_text() == text and not distill_file.meta_path(out).exists()
    assert main(_argv(model_dir, out, a, extra=["--adopt"])) == 0
    assert "distilled 1 new" in capsys.readouterr().out
    assert json.loads(distill_file.meta_path(out).read_text())["prompts"] == 3
    assert out.read_text().startswith(text) and [r["index"] for r in _records(out)] == [0, 1, 2]


def test_an_older_output_made_with_another_budget_is_not_adopted(model_dir, files, tmp_path, capsys):
    a, _ = files
    out = tmp_path / "d.jsonl"
    assert main(_argv(model_dir, out, a)) == 0  # --max-new-tokens 8
    legacy = [{k: v for k, v in r.items() if k != "source"} for r in _records(out)]
    cut = [r for r in legacy if len(r["completion_ids"]) == 8]  # stopped by the budget, not by an EOS
    assert cut, "the tiny model should run to the budget on some prompt"
    out.write_text("".join(json.dumps(r) + "\n" for r in legacy))
    distill_file.meta_path(out).unlink()
    argv = _argv(model_dir, out, a, extra=["--adopt"])
    argv[argv.index("--max-new-tokens") + 1] = "16"
    assert main(argv) == 2
    _one_line_error(capsys, "made with --max-new-tokens 8, not 16", "not adopted")
    assert not distill_file.meta_path(out).exists()


def test_a_read_only_place_is_one_line(model_dir, files, tmp_path, capsys, monkeypatch):
    a, b = files
    if sys.platform.startswith("linux") and os.path.isdir("/sys"):  # sysfs takes no new files, even from root
        assert main(_argv(model_dir, "/sys/sbd-distill-test.jsonl", a)) == 2
        _one_line_error(capsys, "cannot write")
    folder = tmp_path / "ro"
    folder.mkdir()
    out = folder / "d.jsonl"
    assert main(_argv(model_dir, out, a)) == 0
    before = out.read_bytes()
    folder.chmod(0o555)
    out.chmod(0o444)
    try:
        if os.access(out, os.W_OK):  # root ignores the modes: refuse the writes as the kernel would
            def denied(path, write):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            monkeypatch.setattr(distill_file, "write_atomically", denied)
        assert main(_argv(model_dir, out, a, b)) == 2
        _one_line_error(capsys, "ermission denied")
    finally:
        folder.chmod(0o755)
        out.chmod(0o644)
    assert out.read_bytes() == before


def test_a_full_disk_is_one_line_and_keeps_whole_records(model_dir, files, tmp_path, capsys, monkeypatch):
    a, b = files
    out = tmp_path / "d.jsonl"
    write, calls = distill_mod._write_all, []

    def full(fd, data):
        calls.append(1)
        if len(calls) > 2:
            os.write(fd, data[:10])  # part of a record reaches the disk, then it is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(fd, data)
    monkeypatch.setattr(distill_mod, "_write_all", full)
    assert main(_argv(model_dir, out, a, b)) == 2
    _one_line_error(capsys, "No space left on device", "intact")
    recs = _records(out)  # every line is a whole record
    assert len(recs) == 2
    monkeypatch.undo()
    assert main(_argv(model_dir, out, a, b)) == 0
    assert "distilled 3 new" in capsys.readouterr().out
    assert [r["index"] for r in _records(out)] == [0, 1, 2, 3, 4]


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["distill", "--help"])
    text = capsys.readouterr().out
    for option in ("--model", "--prompts", "--out", "--adopt", "--no-chat", "--max-new-tokens", "--batch-size",
                   "--temperature", "--seed", "--threads", "--device", "--no-progress", "meta.json"):
        assert option in text
