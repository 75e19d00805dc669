"""`sbd train --adapter lora` end to end on a toy task: only the adapter learns, the masked loss falls,
the frozen model's weights are untouched, --out loads as model + adapter, and --resume continues.
Also `sbd distill` writes exact-token records that `sbd train` reads, and resumes after a torn line."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

import sbd
from sbd.drafters import adapter as adapters
from sbd.cli import main
from sbd.models import tiny

COUNTS = [" ".join(str(i) for i in range(s, s + 9)) for s in range(40)]


def _setup(root):
    model, _ = tiny.create(root / "model", texts=COUNTS + tiny.SAMPLE_TEXT, vocab_size=260, hidden=48, layers=2,
                           heads=4, kv_heads=2, context=128)
    with torch.no_grad():  # a frozen random output layer of std 0.02 caps every logit near ±1: no adapter
        model.get_output_embeddings().weight.mul_(30.0)  # could ever be confident through it
    model.save_pretrained(root / "model")
    with open(root / "toy.jsonl", "w") as f:
        for s in range(40):
            f.write(json.dumps({"prompt": f"count {s}:", "completion": " " + COUNTS[s]}) + "\n")


def _argv(root, out, steps, extra=()):
    return ["train", "--model", str(root / "model"), "--data", str(root / "toy.jsonl"), "--out", str(out),
            "--adapter", "lora", "--rank", "8", "--steps", str(steps), "--batch-size", "16", "--lr", "1e-2",
            "--warmup-steps", str(min(5, steps - 1)), "--logging-steps", "10", "--save-steps", "20", "--block-size", "4",
            "--align-to-completion", "--no-progress", *extra]


def test_adapter_run_trains_only_the_adapter_and_resumes(tmp_path):
    _setup(tmp_path)
    before = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert main(_argv(tmp_path, tmp_path / "ad", 40, ["--kl-weight", "0.5"])) == 0
    logs = [json.loads(x) for x in (tmp_path / "ad" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["matp_loss"] for r in logs if "matp_loss" in r]
    assert "ntp_loss" not in logs[0] and "kl" in logs[0]
    assert losses[-1] < 0.7 * losses[0]
    files = sorted(p.name for p in (tmp_path / "ad").iterdir())
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files
    ck = sorted(p.name for p in (tmp_path / "ad" / "checkpoint-40").iterdir())
    assert "adapter_model.safetensors" in ck and "model.safetensors" not in ck
    after = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)

    model, tok = sbd.load(tmp_path / "ad")  # the folder names its base model
    assert adapters.adapter_of(model).config.block_size == 4
    prompt = tok("count 3:").input_ids
    base, _ = sbd.load(tmp_path / "model")
    ref = sbd.generate(base, tok, [prompt], method="ntp", max_new_tokens=20)
    out = sbd.generate(model, tok, [prompt], method="sbd-verify", max_new_tokens=20)
    assert out.token_ids == ref.token_ids

    # resume: a run stopped at 20 and continued to 40 ends with the same adapter
    assert main(_argv(tmp_path, tmp_path / "r", 40, ["--kl-weight", "0.5", "--save-total-limit", "0"])) == 0
    half = tmp_path / "half"
    half.mkdir()
    import shutil

    shutil.copytree(tmp_path / "r" / "checkpoint-20", half / "checkpoint-20")
    # a checkpoint says what its drafter is being trained for (partially revealed blocks: both decodings)
    recorded = json.loads((half / "checkpoint-20" / "adapter_config.json").read_text())["trained_for"]
    assert recorded == ["sbd", "sbd-verify"]
    shutil.copy(tmp_path / "r" / "sbd_train.json", half / "sbd_train.json")
    assert main(_argv(tmp_path, half, 40, ["--kl-weight", "0.5", "--resume", "--save-total-limit", "0"])) == 0
    a = load_file(str(tmp_path / "r" / "adapter_model.safetensors"))
    b = load_file(str(half / "adapter_model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_distill_records_train_and_resume_after_a_torn_line(tmp_path, capsys):
    _setup(tmp_path)
    prompts = tmp_path / "p.txt"
    prompts.write_text("count 1:\ncount 2:\ncount 3:\n")
    out = tmp_path / "d.jsonl"
    argv = ["distill", "--model", str(tmp_path / "model"), "--prompts", str(prompts), "--out", str(out),
            "--no-chat", "--max-new-tokens", "12", "--batch-size", "2", "--no-progress"]
    assert main(argv) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["index"] for r in recs] == [0, 1, 2]
    model, tok = sbd.load(tmp_path / "model")
    ref = sbd.generate(model, tok, ["count 2:"], method="ntp", max_new_tokens=12)
    assert recs[1]["completion_ids"] == ref.token_ids[0] and recs[1]["prompt_ids"] == tok("count 2:").input_ids
    out.write_text("\n".join(out.read_text().splitlines()[:2]) + '\n{"index": 2, "prom')  # torn last write
    assert main(argv) == 0
    assert "distilled 1 new" in capsys.readouterr().out
    again = [json.loads(x) for x in out.read_text().splitlines()]
    assert again == recs
    assert main(["train", "--model", str(tmp_path / "model"), "--data", str(out), "--out", str(tmp_path / "t"),
                 "--adapter", "lora", "--steps", "2", "--batch-size", "3", "--no-progress"]) == 0


def test_an_adapter_folder_as_model_continues_that_adapter(tmp_path, capsys):
    """Warm start: --model names a trained adapter; training goes on from its weights, on the same base."""
    _setup(tmp_path)
    assert main(_argv(tmp_path, tmp_path / "first", 20)) == 0
    first = load_file(str(tmp_path / "first" / "adapter_model.safetensors"))
    argv = _argv(tmp_path, tmp_path / "more", 20)
    argv[argv.index("--model") + 1] = str(tmp_path / "first")
    assert main(argv) == 0
    assert "continuing the drafting adapter" in capsys.readouterr().out
    more = load_file(str(tmp_path / "more" / "adapter_model.safetensors"))
    assert more.keys() == first.keys() and any(not torch.equal(first[k], more[k]) for k in first)
    first_loss = [json.loads(x) for x in (tmp_path / "first" / "metrics.jsonl").read_text().splitlines()][0]
    more_loss = [json.loads(x) for x in (tmp_path / "more" / "metrics.jsonl").read_text().splitlines()][0]
    assert more_loss["matp_loss"] < first_loss["matp_loss"]  # it starts where the first run ended
    assert json.loads((tmp_path / "more" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        json.loads((tmp_path / "first" / "adapter_config.json").read_text())["base_model_name_or_path"]
    rank = argv.index("--rank")
    argv[rank + 1] = "4"
    argv[argv.index("--out") + 1] = str(tmp_path / "other")
    assert main(argv) == 2 and "give --rank 8" in capsys.readouterr().err
    full = [a for a in argv if a not in ("--adapter", "lora")]
    full[full.index("--rank") + 1] = "8"
    assert main(full) == 2 and "is a drafting adapter" in capsys.readouterr().err


def test_a_rank_beyond_the_layers_or_the_memory_is_refused_before_building(tmp_path, capsys, monkeypatch):
    _setup(tmp_path)
    argv = _argv(tmp_path, tmp_path / "big", 2)
    argv[argv.index("--rank") + 1] = "100000"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--rank 100000 is larger than the adapted layers allow" in err and "use --rank 24 or less" in err
    assert "\n" not in err
    from sbd.training import adapter_setup

    monkeypatch.setattr(adapter_setup, "available_bytes", lambda device: 100_000)  # a machine with 100 kB free
    assert main(_argv(tmp_path, tmp_path / "mem", 2)) == 2
    err = capsys.readouterr().err.strip()
    assert "--rank 8 needs about 264.8 KiB" in err and "97.7 KiB available; use --rank 2 or less" in err and "\n" not in err
    assert not (tmp_path / "mem" / "adapter_model.safetensors").exists()


def test_a_shipped_base_is_recorded_by_its_name_and_the_hint_loads(tmp_path, capsys, monkeypatch):
    """`--model demo` records `demo` (not `<cwd>/demo`): the printed `sbd generate --model OUT` works anywhere."""
    with open(tmp_path / "toy.jsonl", "w") as f:
        for s in range(8):
            f.write(json.dumps({"prompt": f"{s} + 1 =", "completion": f" {s + 1}"}) + "\n")
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    assert main(["train", "--model", "demo", "--data", str(tmp_path / "toy.jsonl"), "--out", "ad", "--adapter",
                 "lora", "--rank", "2", "--steps", "1", "--batch-size", "4", "--no-progress"]) == 0
    hint = capsys.readouterr().out.split("sbd generate --model ")[1].split()[0]
    assert json.loads((tmp_path / "run" / "ad" / "adapter_config.json").read_text())["base_model_name_or_path"] == "demo"
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run" / hint if not hint.startswith("/") else hint
    model, tok = sbd.load(out)
    assert adapters.adapter_of(model) is not None
    monkeypatch.chdir(tmp_path / "run")
    assert main(["generate", "--model", hint, "1 + 1 =", "--method", "sbd-verify", "--max-new-tokens", "4"]) == 0
