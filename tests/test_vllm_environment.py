"""`sbd.integrations.vllm.environment.check`: vLLM's environment is one folder in sbd's cache that every checkout
shares, with sbd installed there from the checkout that last ran `sbd vllm-setup`. A checkout must not run
another checkout's plug-in silently (nor a moved or deleted one's: "No module named sbd" from deep inside
vLLM). No vLLM needed: the environment's python is a script that answers the probe."""

from __future__ import annotations

from pathlib import Path

import pytest

import sbd
from sbd.errors import SBDError
from sbd.integrations.vllm import environment

HERE = Path(sbd.__file__).resolve()


def fake_venv(tmp_path: Path, answer: str, code: int = 0) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho '{answer}'\necho 'ModuleNotFoundError: No module named sbd' >&2\nexit {code}\n")
    python.chmod(0o755)
    return venv


def test_an_environment_that_runs_this_checkouts_sbd_passes(tmp_path):
    venv = fake_venv(tmp_path, f"{environment.SUPPORTED[0]} True {HERE}")
    assert environment.check(venv) == venv / "bin" / "python"


def test_an_environment_set_up_from_another_checkout_is_refused(tmp_path):
    other = tmp_path / "other" / "sbd" / "__init__.py"
    venv = fake_venv(tmp_path, f"{environment.SUPPORTED[0]} True {other}")
    with pytest.raises(SBDError, match=r"runs sbd from .*other, not from this checkout .*run `sbd vllm-setup` here"):
        environment.check(venv)


def test_an_environment_whose_sbd_is_gone_says_what_to_run(tmp_path):
    venv = fake_venv(tmp_path, "", code=1)
    with pytest.raises(SBDError, match=r"No module named sbd\); run `sbd vllm-setup`"):
        environment.check(venv)
