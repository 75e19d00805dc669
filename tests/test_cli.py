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
    out = capsys.readouterr().out
    assert out.count("--- ntp (") == 2 and out.count("--- sbd (") == 2 and out.count("--- sbd-verify (") == 2
    assert "same tokens as NTP: True" in out
    assert "NFE speedup" in out and "tokens/forward" in out and "tokens/s" in out


def test_generate_single_method(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir), "hi", "--method", "ntp", "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "--- ntp" in out and "--- sbd" not in out


def test_generate_anchored_plain_sbd(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir), "hi", "--method", "sbd", "--anchor", "--gamma", "0",
                 "--max-new-tokens", "6"]) == 0
    anchored = capsys.readouterr().out
    assert main(["generate", "--model", str(model_dir), "hi", "--method", "ntp", "--max-new-tokens", "6"]) == 0
    ntp = capsys.readouterr().out
    text = lambda out: out.split("--- ", 1)[1].split("\n", 1)[1].split("\n")[0]  # noqa: E731
    assert text(anchored) == text(ntp)  # γ = 0: the next-token head's tokens, one per forward


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
