"""`sbd train` end to end on a toy task (SPEC §2), and one clear error per bad input."""

from __future__ import annotations

import json

import pytest
import torch

import sbd
from sbd.models import tiny
from sbd.cli import main
from sbd.training.collator import SBDDataCollator
from sbd.training.data import load_records, tokenize_records
from sbd.training.loss import sbd_loss

@torch.no_grad()
def evaluate_losses(model, collator, examples, block_size=4, seed=0, batch_size=16) -> dict:
    """Held-out NTP and MATP losses on fixed batches (the same masks for every model compared)."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    sums = torch.zeros(4, dtype=torch.float64)
    for start in range(0, len(examples), batch_size):
        clean = collator.pad([examples[i] for i in range(start, min(start + batch_size, len(examples)))])
        eta, u = collator.draw_noise(clean["input_ids"].shape[0], collator.noisy_length(clean), g)
        batch = collator.corrupt(clean, block_size, eta, u)
        labels, num_clean = batch.pop("labels"), batch.pop("num_clean")
        parts = sbd_loss(model(**batch).logits, labels, num_clean)
        sums += torch.tensor([parts.ntp_sum, parts.ntp_count, parts.matp_sum, parts.matp_count], dtype=torch.float64)
    return {"ntp_loss": float(sums[0] / sums[1].clamp_min(1)), "matp_loss": float(sums[2] / sums[3].clamp_min(1))}


COUNTS = [" ".join(str(i) for i in range(s, s + 9)) for s in range(40)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    tiny.create(root / "model", texts=COUNTS + tiny.SAMPLE_TEXT, vocab_size=260, hidden=48, layers=2, heads=4,
                kv_heads=2, context=128)
    with open(root / "toy.jsonl", "w") as f:
        for s in range(40):
            f.write(json.dumps({"prompt": f"count {s}:", "completion": " " + COUNTS[s]}) + "\n")
    return root


def _train(workdir, out, mode, extra=()):
    argv = ["train", "--model", str(workdir / "model"), "--data", str(workdir / "toy.jsonl"), "--out", str(out),
            "--mode", mode, "--steps", "150", "--batch-size", "16", "--lr", "5e-3", "--warmup-steps", "10",
            "--logging-steps", "10", "--save-steps", "150", "--block-size-max", "8", "--no-progress", *extra]
    assert main(argv) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_sbd_run_lowers_both_losses_and_ntp_run_leaves_matp_high(workdir, capsys):
    held = ["--eval-data", str(workdir / "toy.jsonl"), "--eval-n", "8", "--eval-steps", "50", "--eval-block-size", "4"]
    logs = _train(workdir, workdir / "sbd", "sbd", held)
    assert "Writing model shards" not in capsys.readouterr().err  # --no-progress silences Hugging Face's bars too
    checks = [r for r in logs if "gap" in r]  # the convergence check, logged at steps 50, 100 and 150
    assert [r["step"] for r in checks] == [50, 100, 150]
    assert all(r["gap"] == pytest.approx(r["masked_acc"] - r["ntp_acc"], abs=0.02) for r in checks)
    assert checks[-1]["masked_acc"] > checks[0]["masked_acc"] + 5, checks
    logs_sbd = [r for r in logs if "ntp_loss" in r]
    first, last = logs_sbd[0], logs_sbd[-1]
    assert last["ntp_loss"] < 0.6 * first["ntp_loss"]
    assert last["matp_loss"] < 0.6 * first["matp_loss"]
    assert all(r["tokens_per_s"] > 0 for r in logs_sbd)
    _train(workdir, workdir / "ntp", "ntp")  # the MATP-ablated run: same data, steps and order

    base, tok = sbd.load(workdir / "model")
    examples = tokenize_records(load_records(str(workdir / "toy.jsonl")), tok, 64, tok.mask_token_id)
    collator = SBDDataCollator(tok)
    scores = {name: evaluate_losses(sbd.load(workdir / name)[0] if name != "base" else base, collator,
                                    examples, block_size=4, seed=0) for name in ("base", "sbd", "ntp")}
    assert scores["sbd"]["matp_loss"] < 0.5 * scores["ntp"]["matp_loss"], scores
    assert scores["ntp"]["matp_loss"] > 0.6 * scores["base"]["matp_loss"], scores
    assert scores["ntp"]["ntp_loss"] < 0.6 * scores["base"]["ntp_loss"], scores
    assert scores["sbd"]["ntp_loss"] < 0.6 * scores["base"]["ntp_loss"], scores

    # the output folder is a model that sbd.load and sbd.generate use directly
    model, tokenizer = sbd.load(workdir / "sbd")
    assert model.config.sbd_mask_token_id == tokenizer.mask_token_id
    result = sbd.generate(model, tokenizer, ["count 3:"], method="sbd", block_size=4, gamma=0.5, max_new_tokens=12)
    assert result.num_tokens > 0 and sum(result.nfe) <= result.num_tokens


def test_reasoning_gym_source_renders_prompt_completion():
    records = load_records("reasoning-gym:chain_sum?size=4&seed=3")
    assert len(records) == 4 and records == load_records("reasoning-gym:chain_sum?size=4&seed=3")
    assert all(set(r) == {"prompt", "completion"} and r["completion"] for r in records)


def test_truncation_is_counted(workdir):
    _, tok = sbd.load(workdir / "model", probe=False)
    with pytest.warns(UserWarning, match="2 of 3 sequences were longer than 8 tokens"):
        ds = tokenize_records([{"text": COUNTS[0]}, {"text": COUNTS[1]}, {"text": "1 2"}], tok, 8)
    assert max(len(ds[i]["input_ids"]) for i in range(3)) == 8


def test_a_second_run_on_the_same_folder_is_refused_and_a_dead_run_leaves_no_lock(workdir, tmp_path, capsys):
    import subprocess
    import sys

    from sbd.training.run_lock import run_lock

    out = tmp_path / "run"
    argv = ["train", "--model", str(workdir / "model"), "--data", str(workdir / "toy.jsonl"), "--out", str(out),
            "--no-progress", "--steps", "1"]
    with run_lock(out):  # a run in progress on this folder
        assert "another `sbd train`" in _error(capsys, argv)
        assert "another `sbd train`" in _error(capsys, argv + ["--resume"])
    # a run killed while holding the lock: the lock dies with its process
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from sbd.training.run_lock import run_lock\n"
                               "with run_lock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(60)", str(out)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    assert "another `sbd train`" in _error(capsys, argv)
    holder.kill()
    holder.wait()
    assert main(argv) == 0 and (out / "model.safetensors").exists()


def test_a_finished_run_is_refused_unless_resume_or_overwrite_says_otherwise(workdir, tmp_path, capsys):
    import shutil

    from sbd.training.run import METRICS_FILE, RUN_FILE

    out = tmp_path / "x"
    argv = ["train", "--model", str(workdir / "model"), "--data", str(workdir / "toy.jsonl"), "--out", str(out),
            "--batch-size", "2", "--block-size-max", "8", "--no-progress"]
    assert main(argv + ["--steps", "2"]) == 0
    shutil.rmtree(out / "checkpoint-2")  # only the final model, its settings and its metrics are left
    before = {name: (out / name).read_bytes() for name in ("model.safetensors", RUN_FILE, METRICS_FILE)}
    again = argv + ["--steps", "3", "--lr", "1e-3"]
    err = _error(capsys, again)
    assert repr(str(out)) in err and "finished run" in err and "--resume" in err and "--overwrite" in err, err
    err = _error(capsys, again + ["--resume"])  # a finished run has nothing to continue from
    assert "finished run" in err and "no checkpoint" in err and f"--model {out}" in err, err
    assert "cannot be combined" in _error(capsys, again + ["--resume", "--overwrite"])
    assert {name: (out / name).read_bytes() for name in before} == before  # nothing was touched
    (out / "notes.txt").write_text("mine")

    assert main(again + ["--overwrite"]) == 0  # replaced: new settings, only the new run's metrics
    assert json.loads((out / RUN_FILE).read_text())["steps"] == 3
    assert (out / "model.safetensors").read_bytes() != before["model.safetensors"]
    assert max(json.loads(line)["step"] for line in (out / METRICS_FILE).read_text().splitlines()) == 3
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    assert (out / "notes.txt").read_text() == "mine"  # what sbd did not write stays

    # a run stopped before its first checkpoint left its settings only: refused; --resume names --overwrite
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / RUN_FILE).write_text((out / RUN_FILE).read_text())
    stopped_argv = [a if a != str(out) else str(stopped) for a in again]
    err = _error(capsys, stopped_argv)
    assert "--resume" in err and "--overwrite" in err, err
    err = _error(capsys, stopped_argv + ["--resume"])
    assert "no checkpoint" in err and "--overwrite" in err, err

    # a model folder sbd train did not write (a user's own model given as --out): refused, nothing touched
    foreign = tmp_path / "foreign"
    shutil.copytree(workdir / "model", foreign)
    files = {p.name: p.read_bytes() for p in foreign.iterdir() if p.is_file()}
    err = _error(capsys, [a if a != str(out) else str(foreign) for a in again])
    assert "holds a model that no sbd train run made" in err, err
    assert {p.name: p.read_bytes() for p in foreign.iterdir() if p.is_file()} == files


def test_a_config_is_never_changed_and_the_run_records_the_max_len_it_filled_in(workdir, tmp_path):
    import dataclasses

    from sbd.training.run import RUN_FILE, TrainConfig, train

    config = TrainConfig(model=workdir / "model", data=workdir / "toy.jsonl", out=tmp_path / "run", steps=1,
                         batch_size=2, block_size_max=8, progress=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_len = 64
    train(config)
    assert config.max_len is None  # the caller's config is as it was made
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text())["max_len"] == 128  # the model's context


def _error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("sbd: error: "), err
    return err[0]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_bad_inputs_give_one_clear_error(workdir, tmp_path, capsys):
    model = str(workdir / "model")
    out = str(tmp_path / "out")
    good = str(workdir / "toy.jsonl")

    def run(*extra, data=good, out=out):
        return _error(capsys, ["train", "--model", model, "--data", data, "--out", out, "--no-progress",
                               "--steps", "2", *extra])

    assert "does not exist" in run(data=str(tmp_path / "missing.jsonl"))
    assert "no training records" in run(data=_write(tmp_path / "empty.jsonl", []))
    assert "neither 'text' nor 'prompt'" in run(data=_write(tmp_path / "f.jsonl", ['{"question": "q"}']))
    err = run(data=_write(tmp_path / "g.jsonl", ['{"text": "1 2"}', "", '{"prompt": "q"}']))
    assert "g.jsonl:3" in err and "no 'completion'" in err and "'prompt' and 'completion'" in err, err
    err = run(data=_write(tmp_path / "g2.jsonl", ['{"prompt": "q", "completion": 3}']))
    assert "g2.jsonl:1" in err and "'completion' must be a string" in err, err
    assert "not valid JSON" in run(data=_write(tmp_path / "h.jsonl", ['{"text": ']))
    (tmp_path / "latin1.jsonl").write_bytes('{"text": "ok"}\n{"text": "caf\u00e9"}\n'.encode("latin-1"))
    assert "latin1.jsonl:2: not UTF-8" in run(data=str(tmp_path / "latin1.jsonl"))
    assert "at least 2" in run(data=_write(tmp_path / "s.jsonl", ['{"text": ""}']))
    long_prompt = json.dumps({"prompt": " ".join(["1 2 3"] * 10), "completion": "4"})
    assert "no room for the completion" in run("--max-len", "8", "--block-size-max", "4", data=_write(tmp_path / "p.jsonl", [long_prompt]))
    assert "--lr must be a positive" in run("--lr", "-1")
    assert "--lr must be a positive" in run("--lr", "nan")
    assert "--steps must be >= 1" in run("--steps", "0")
    assert "--batch-size must be >= 1" in run("--batch-size", "0")
    assert "--block-size-min" in run("--block-size-min", "9", "--block-size-max", "4")
    assert "--mask-rate" in run("--mask-rate", "1.5")
    assert "--max-len must be >= 2" in run("--max-len", "1")
    assert "no checkpoint" in run("--resume")
    assert "reasoning-gym cannot create" in run(data="reasoning-gym:no_such_task?size=3")
    assert "unknown option" in run(data="reasoning-gym:chain_sum?sise=3")
    assert "does not exist" in _error(capsys, ["train", "--model", str(tmp_path / "nope"), "--data", good,
                                               "--out", out, "--no-progress"])
    (tmp_path / "used" / "checkpoint-3").mkdir(parents=True)
    err = run(out=str(tmp_path / "used"))
    assert "already holds an sbd train run" in err and "--resume" in err and "--overwrite" in err, err
