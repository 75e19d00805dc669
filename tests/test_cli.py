"""The `sbd` command line: init + generate end to end, one-line errors, --help for every option."""

import subprocess
import sys

import pytest

from sbd.cli import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny"
    assert main(["init", "--out", str(path), "--hidden", "32", "--layers", "2", "--vocab-size", "300"]) == 0
    return path


def test_generate_compare_prints_every_method(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir), "hello", "12 + 34", "--compare", "--max-new-tokens", "12",
                 "--block-size", "4", "--gamma", "0.5"]) == 0
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert out.count("=== prompt ") == 2
    assert out.count("--- ntp\n") == 2 and out.count("--- sbd\n") == 2 and out.count("--- sbd-verify\n") == 2
    # the statistics go to stderr, each speedup naming its baseline
    assert "same tokens as NTP: True" in err and "sbd-verify vs NTP" in err and "sbd vs NTP" in err
    assert "NFE speedup" in err and "tokens/forward" in err and "tokens/s" in err and "NFE per prompt" in err
    assert "NFE" not in out and "tokens/s" not in out and "speedup" not in out


def test_generate_single_method(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir), "hi", "--method", "ntp", "--max-new-tokens", "5"]) == 0
    captured = capsys.readouterr()
    assert "---" not in captured.out and "===" not in captured.out  # one answer alone: no label
    assert "NTP" in captured.err and "tokens/forward" in captured.err


def test_generate_prints_the_answer_alone_on_stdout_and_statistics_on_stderr(capsys):
    """`sbd generate ... > answer.txt` captures the answer and nothing else."""
    import sbd

    model, tokenizer = sbd.load("demo")
    expected = sbd.generate(model, tokenizer, ["Add up: 1 + 2"], method="ntp", max_new_tokens=128).texts[0]
    capsys.readouterr()
    assert main(["generate", "--model", "demo", "Add up: 1 + 2"]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected + "\n"  # sbd-verify (the default): the model's own greedy answer
    for stat in ("SBD-VERIFY", "NFE", "tokens/forward", "tokens/s", "drafting"):
        assert stat in captured.err and stat not in captured.out


def test_generate_anchored_plain_sbd(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir), "hi", "--method", "sbd", "--anchor", "--gamma", "0",
                 "--max-new-tokens", "6"]) == 0
    anchored = capsys.readouterr().out
    assert main(["generate", "--model", str(model_dir), "hi", "--method", "ntp", "--max-new-tokens", "6"]) == 0
    ntp = capsys.readouterr().out
    assert anchored == ntp  # γ = 0: the next-token head's tokens, one per forward


@pytest.mark.parametrize("argv,message", [
    (["generate", "--model", "/no/such/model", "x"], "does not exist"),
    (["generate", "--model", "/no/such/model", "x", "--anchor"], "--anchor applies to --method sbd"),
    (["init", "--out", "unused", "--corpus", "/no/such/file"], "does not exist"),
    (["init", "--out", "unused", "--hidden", "30", "--heads", "4"], "divisible"),
])
def test_user_mistakes_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sbd: error:") and message in err and "\n" not in err


def test_bad_option_values_are_rejected_by_the_parser(model_dir, capsys):
    for argv in (["--gamma", "-1"], ["--gamma", "abc"], ["--block-size", "0"], ["--max-new-tokens", "0"]):
        with pytest.raises(SystemExit) as e:
            main(["generate", "--model", str(model_dir), "x", *argv])
        assert e.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_console_script_help_documents_every_option():
    out = subprocess.run([sys.executable, "-m", "sbd.cli", "generate", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for option in ("--model", "--method", "--block-size", "--draft", "--gamma", "--proxy", "--max-new-tokens",
                   "--temperature", "--seed", "--stop", "--compare", "--device", "--anchor"):
        assert option in out.stdout
