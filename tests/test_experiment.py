"""`sbd experiment toy`: the whole pipeline (data, init, pretrain, fine-tunes, release, eval) end to end,
phase resume, shipping, and the demo on what was shipped."""

import json

import pytest
import torch

import sbd
from sbd.cli import demo as demo_mod
from sbd.models import names as names_mod
from sbd.cli import main
from sbd.experiment import PHASES, Experiment


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("exp") / "toy"
    threads = torch.get_num_threads()
    try:
        assert main(["experiment", "toy", "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    return out


def test_every_phase_leaves_its_artefacts(run):
    for phase in PHASES:
        assert (run / phase / ".done").exists(), phase
    record = json.loads((run / "experiment.json").read_text())
    assert set(record["phase_seconds"]) == set(PHASES)
    results = json.loads((run / "eval" / "results.json").read_text())
    configs = {(r["label"], r["method"], r["gamma"]) for r in results["rows"]}
    assert configs == {("NTP-trained", "ntp", None), ("SBD-trained", "ntp", None),
                       ("SBD-trained", "sbd", 0.0), ("SBD-trained", "sbd", 1.0)}
    assert (run / "eval" / "accuracy_vs_speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Table 1" in (run / "eval" / "results.md").read_text()
    assert (run / "eval" / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    checks = json.loads((run / "eval" / "convergence.json").read_text())
    assert set(checks) == {"ntp", "sbd"} and all(c["headline"]["tokens"] > 0 for c in checks.values())
    for mode in ("ntp", "sbd"):  # both trainings logged the held-out convergence check
        logs = [json.loads(line) for line in (run / mode / "metrics.jsonl").read_text().splitlines()]
        assert any("gap" in r for r in logs), mode


def test_no_pretraining_trains_both_models_from_the_random_start(tmp_path, monkeypatch):
    """A scale without pretraining: SBD loss from the first step, the NTP run from the same start."""
    import dataclasses

    from sbd import experiment

    monkeypatch.setitem(experiment.SCALES, "toy", dataclasses.replace(experiment.SCALES["toy"], pretrain_steps=0))
    exp = Experiment("toy", tmp_path / "run", progress=False)
    for phase in ("data", "init", "pretrain", "ntp"):
        exp.path(phase).mkdir(parents=True, exist_ok=True)
        {"data": exp.make_data, "init": exp.make_model, "pretrain": exp.pretrain, "ntp": lambda: exp.finetune("ntp")}[phase]()
    assert not (exp.path("pretrain") / "model.safetensors").exists()
    settings = json.loads((exp.path("ntp") / "sbd_train.json").read_text())
    assert settings["steps"] == experiment.SCALES["toy"].finetune_steps
    assert settings["model"] == str(exp.path("init"))
    assert (exp.path("ntp") / "model.safetensors").exists()


def test_released_models_are_fp16_files_that_load_and_decode(run):
    for mode in ("ntp", "sbd"):
        model, tok = sbd.load(run / "release" / mode)
        assert model.config.sbd_mask_token_id == tok.mask_token_id
        from safetensors import safe_open

        with safe_open(str(run / "release" / mode / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    out = sbd.generate(model, tok, ["Add up: 1 + 2 + 3 + 4\n"], method="sbd", max_new_tokens=8)
    assert out.nfe[0] >= 1


def test_a_finished_run_is_not_redone(run, capsys):
    before = {p: (run / p / ".done").stat().st_mtime for p in PHASES}
    Experiment("toy", run, progress=False).run()
    assert "skipped" in capsys.readouterr().out
    assert before == {p: (run / p / ".done").stat().st_mtime for p in PHASES}


def test_another_scale_in_the_same_folder_is_refused(run):
    with pytest.raises(sbd.SBDError, match="toy"):
        Experiment("tiny", run)


def test_ship_then_demo(run, tmp_path, monkeypatch, capsys):
    dest = tmp_path / "demo_model"
    Experiment("toy", run).ship(dest)
    monkeypatch.setattr(names_mod, "DEMO_DIR", dest)
    model, _ = sbd.load("demo")
    assert model.config.sbd_mask_token_id is not None
    stats = demo_mod.run_demo(n=1, max_new_tokens=8, colour=False)
    out, err = capsys.readouterr()
    assert "sbd: decoding the demo's problems: 12/12 (" in err  # progress off a terminal: a line at the end at least
    assert "SBD-trained, NTP" in out and "SBD-trained, SBD" in out and "⟨1⟩" in out
    assert "NTP-trained, NTP" in out and stats["baseline"]["nfe"] == stats["baseline"]["tokens"]
    assert stats["ntp"]["nfe"] == stats["ntp"]["tokens"] and stats["sbd"]["nfe"] <= stats["sbd"]["tokens"]
    assert "SBD-trained, SBD-verify" in out and "the same answers as NTP decoding of the same model on 3 of 3" in out
    # every speedup names its baseline: the table's the NTP-trained model, the SBD-verify sentence's the same model
    assert "NFE speedup vs NTP-trained, NTP" in out and "wall-clock vs NTP-trained, NTP" in out
    assert "against that decoding (SBD-trained, NTP)" in out


def test_missing_demo_model_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(names_mod, "DEMO_DIR", tmp_path / "nothing")
    with pytest.raises(sbd.SBDError, match="sbd experiment tiny"):
        sbd.load("demo")


def test_annotation_marks_each_token_with_its_forward(tokenizer):
    ids = tokenizer("ab cd").input_ids
    steps = list(range(1, len(ids) + 1))[::-1]
    text = demo_mod.annotate(tokenizer, ids, steps, colour=False)
    assert text.replace("⟨", "").replace("⟩", "").rstrip("0123456789") != ""
    assert [int(s.split("⟩")[0]) for s in text.split("⟨")[1:]] == steps
    assert "\x1b[" in demo_mod.annotate(tokenizer, ids, steps, colour=True)
