"""Bad inputs found by trying the command line and the API as a new user would (issue 20): each one is
refused in one line (`sbd: error: …`, exit 2, or an SBDError), and nothing a user made is destroyed."""

from __future__ import annotations

import json

import pytest
import torch

import sbd
from sbd.cli import main
from sbd.errors import SBDError
from sbd.models import tiny

TEXTS = [" ".join(str(i) for i in range(s, s + 7)) for s in range(12)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    tiny.create(root / "model", texts=TEXTS, vocab_size=200, hidden=32, layers=2, heads=4, kv_heads=2, context=64)
    (root / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return root


def _one_line_error(capsys, argv, *words):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sbd: error:") and "\n" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def _train(root, out, *extra):
    return ["train", "--model", str(root / "model"), "--data", str(root / "d.jsonl"), "--out", str(out),
            "--steps", "2", "--batch-size", "4", "--no-progress", *extra]


def test_init_never_overwrites_a_model(root, tmp_path, capsys):
    import shutil

    keep = tmp_path / "trained"
    shutil.copytree(root / "model", keep)
    before = (keep / "model.safetensors").read_bytes()
    _one_line_error(capsys, ["init", "--out", str(keep)], "not empty", "--force")
    assert (keep / "model.safetensors").read_bytes() == before
    f = tmp_path / "file"
    f.write_text("x")
    _one_line_error(capsys, ["init", "--out", str(f)], "is a file")
    assert main(["init", "--out", str(keep), "--force", "--hidden", "32", "--heads", "4", "--kv-heads", "2"]) == 0
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    _one_line_error(capsys, ["init", "--out", str(tmp_path / "new"), "--corpus", str(latin)], "not UTF-8", "latin.txt")


def test_train_refusals(root, tmp_path, capsys):
    before = (root / "model" / "model.safetensors").read_bytes()
    _one_line_error(capsys, _train(root, root / "model"), "--out is the --model folder")
    assert (root / "model" / "model.safetensors").read_bytes() == before
    _one_line_error(capsys, _train(root, tmp_path / "a", "--block-size", "100000"), "exceeds --max-len")
    _one_line_error(capsys, _train(root, tmp_path / "b", "--block-size-max", "100000"), "exceeds --max-len")
    _one_line_error(capsys, _train(root, tmp_path / "c", "--max-len", "4096"), "exceeds the model's context of 64")
    if not torch.cuda.is_available():
        _one_line_error(capsys, _train(root, tmp_path / "d", "--attention", "flex"), "needs a CUDA GPU")
    (tmp_path / "f").write_text("x")
    _one_line_error(capsys, _train(root, tmp_path / "f" / "run"), "under a file")
    both = tmp_path / "both.jsonl"
    both.write_text(json.dumps({"text": "1 2 3", "prompt": "a", "completion": "b"}) + "\n")
    argv = _train(root, tmp_path / "e")
    argv[argv.index("--data") + 1] = str(both)
    _one_line_error(capsys, argv, "both 'text' and 'prompt'")


def test_a_full_disk_during_a_save_is_one_line(root, tmp_path, capsys, monkeypatch):
    from sbd.drafters import adapter as adapters

    def full(model, folder):
        raise OSError(28, "No space left on device", str(folder))

    monkeypatch.setattr(adapters, "save", full)
    err = _one_line_error(capsys, _train(root, tmp_path / "r", "--adapter", "lora", "--save-steps", "1"),
                          "No space left on device", "checkpoint-1")
    assert "intact" in err


def test_prompts_holding_the_mask_token_are_refused_everywhere(root, capsys, tmp_path):
    model, tok = sbd.load(root / "model")
    mask = tok.convert_ids_to_tokens(model.config.sbd_mask_token_id)
    for method in ("ntp", "sbd", "sbd-verify"):
        with pytest.raises(SBDError, match="contains the SBD mask token"):
            sbd.generate(model, tok, [f"1 2 {mask} 3"], method=method, max_new_tokens=4)
    _one_line_error(capsys, ["generate", "--model", str(root / "model"), "--max-new-tokens", "8", f"1 {mask}"],
                    "mask token")
    prompts = tmp_path / "p.txt"
    prompts.write_text(f"1 2 {mask}\n")
    _one_line_error(capsys, ["bench", "--model", str(root / "model"), "--prompts", str(prompts), "--out",
                             str(tmp_path / "b"), "--max-new-tokens", "8", "--no-progress"], "mask token")


def test_generate_api_and_cli_one_liners(root, llama, capsys):
    model, tok = sbd.load(root / "model")
    with pytest.raises(SBDError, match="prompt 0 is NoneType"):
        sbd.generate(model, tok, [None], method="sbd")
    bad = tiny.random_model(tiny.tiny_config("llama", vocab_size=50, hidden=32, layers=1))
    bad.config.sbd_mask_token_id = 500
    with pytest.raises(SBDError, match="outside its 50 embeddings"):
        sbd.generate(bad, None, [[1, 2]], method="sbd")
    for device in ("foo", "cuda:7" if torch.cuda.is_available() else "cuda"):
        for cmd in (["generate", "--model", str(root / "model"), "hi"],
                    ["eval", "--model", str(root / "model"), "--task", "chain_sum", "--out", "/tmp/x"],
                    ["bench", "--model", str(root / "model"), "--out", "/tmp/x"]):
            _one_line_error(capsys, [*cmd, "--device", device], "device")
    _one_line_error(capsys, ["generate", "--model", str(root / "model"), "--max-new-tokens", "8", "caf\udce9"],
                    "not valid UTF-8")
    _one_line_error(capsys, ["generate", "--model", str(root / "model"), "--compare", "--max-new-tokens", "60",
                             "1 2 3 4 5 6 7 8"], "max_new_tokens (60)")


def test_an_end_token_outside_the_vocabulary_is_refused(llama):
    vocab = llama.get_input_embeddings().num_embeddings
    for bad, shown in (([10 ** 9], str(10 ** 9)), ([3, -1], "-1"), ([vocab], str(vocab)), ([2.5], "2.5"), (7, "7")):
        with pytest.raises(SBDError, match=f"eos_token_ids") as e:
            sbd.generate(llama, None, [[5, 6, 7]], method="ntp", max_new_tokens=3, eos_token_ids=bad)
        assert shown in str(e.value) and "\n" not in str(e.value)
        if not isinstance(bad, int) and all(isinstance(t, int) for t in bad):
            assert f"vocabulary of {vocab}" in str(e.value)
    assert sbd.generate(llama, None, [[5, 6, 7]], method="ntp", max_new_tokens=3, eos_token_ids=[vocab - 1]).nfe


def test_nan_weights_are_named_as_such(root):
    model, _ = sbd.load(root / "model", probe=False)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    from sbd.models.probe import probe_model

    with pytest.raises(SBDError, match="weights are not finite: model.layers.0.mlp.up_proj.weight"):
        probe_model(model)


def test_lm_eval_unknown_task_is_one_line(capsys):
    pytest.importorskip("lm_eval")
    _one_line_error(capsys, ["lm-eval", "--model", "sbd", "--model_args", "pretrained=demo", "--tasks", "no_such_task"],
                    "unknown lm-eval task", "no_such_task")


def test_a_read_only_out_is_one_line_with_the_path(root, tmp_path, capsys, monkeypatch):
    import errno
    import pathlib

    target = tmp_path / "ro" / "run"
    real_mkdir = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    _one_line_error(capsys, _train(root, target), "Read-only file system", str(target))
