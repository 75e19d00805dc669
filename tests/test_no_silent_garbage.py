"""No decoding runs silently where it cannot work, and no setting is silently unused: the defaults are
lossless (sbd-verify), plain SBD is refused for a drafter not trained for it, and each configuration a
user can get wrong is one line naming it (a 400 naming the field on the server)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import sbd
from sbd.drafters import adapter as adapters
from sbd.cli import main
from sbd.decoding.trained_for import check_decoding, trained_for
from sbd.errors import SBDError
from sbd.models import tiny

from conftest import attach_random_adapter, random_prompts

TEXTS = [" ".join(str(i) for i in range(s, s + 7)) for s in range(12)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("garbage")
    tiny.create(root / "model", texts=TEXTS, vocab_size=200, hidden=32, layers=2, heads=4, kv_heads=2, context=64)
    return root / "model"


@pytest.fixture()
def plain(folder):
    model, tokenizer = sbd.load(str(folder))
    return model, tokenizer


def test_the_library_and_the_cli_default_to_sbd_verify(capsys):
    model, tokenizer = sbd.load("demo")
    prompt = ["Add up: 12 + 7 - 3 + 45\n"]
    default = sbd.generate(model, tokenizer, prompt, max_new_tokens=24)
    ntp = sbd.generate(model, tokenizer, prompt, method="ntp", max_new_tokens=24)
    assert default.method == "sbd-verify" and default.token_ids == ntp.token_ids
    capsys.readouterr()
    assert main(["generate", "--model", "demo", "--max-new-tokens", "24", prompt[0].strip()]) == 0
    said_default = capsys.readouterr()
    assert main(["generate", "--model", "demo", "--max-new-tokens", "24", "--method", "ntp", prompt[0].strip()]) == 0
    said_ntp = capsys.readouterr()
    # stdout is the answer alone, the statistics (naming the method) on stderr
    assert "SBD-VERIFY" in said_default.err and said_default.out == said_ntp.out


def test_plain_sbd_is_refused_for_a_drafter_trained_for_verify_drafts_only(plain):
    model, tokenizer = plain
    adapters.attach(model, adapters.AdapterConfig(r=4, block_size=4))  # the default: sbd-verify's drafts only
    try:
        assert trained_for(model) == {"sbd-verify"}
        with pytest.raises(SBDError, match="not trained for plain SBD"):
            sbd.generate(model, tokenizer, ["1 2 3"], method="sbd", max_new_tokens=8)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # sbd-verify on a trained drafter: not a word
            sbd.generate(model, tokenizer, ["1 2 3"], method="sbd-verify", max_new_tokens=8)
    finally:
        adapters.detach(model)


def test_the_shipped_smollm2_adapter_records_verify_drafts_only():
    config = adapters.read_config(Path(sbd.__file__).parent / "adapters" / "smollm2")
    assert config.trained_for == ["sbd-verify"]


def test_an_ntp_trained_model_refuses_plain_sbd_and_warns_on_verify(plain):
    model, tokenizer = plain
    model.config.sbd_trained_for = []
    with pytest.raises(SBDError, match="next-token decoding only"):
        sbd.generate(model, tokenizer, ["1 2 3"], method="sbd", max_new_tokens=8)
    with pytest.warns(UserWarning, match="never trained for drafting"):
        sbd.generate(model, tokenizer, ["1 2 3"], method="sbd-verify", max_new_tokens=8)


def test_a_model_that_records_nothing_warns_loudly_once(plain):
    model, tokenizer = plain
    assert trained_for(model) is None
    with pytest.warns(UserWarning, match="no training for plain SBD"):
        sbd.generate(model, tokenizer, ["1 2 3"], method="sbd", max_new_tokens=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_decoding(model, "sbd")  # said once per model, not on every call


def test_the_demo_model_records_both_decodings():
    model, _ = sbd.load("demo")
    assert trained_for(model) == {"sbd", "sbd-verify"}
    assert trained_for(sbd.load("demo-ntp")[0]) == frozenset()


def test_training_records_what_the_drafter_fits(plain):
    from sbd.training.run import TrainConfig, record_decodings

    model, _ = plain
    record_decodings(model, TrainConfig(model="m", data="d", out="o", mode="sbd"))
    assert model.config.sbd_trained_for == ["sbd", "sbd-verify"]
    record_decodings(model, TrainConfig(model="m", data="d", out="o", mode="ntp"))
    assert model.config.sbd_trained_for == []
    attach_random_adapter(model)
    try:
        record_decodings(model, TrainConfig(model="m", data="d", out="o", adapter="lora", mask_rate=1.0))
        assert adapters.adapter_of(model).config.trained_for == ["sbd-verify"]
    finally:
        adapters.detach(model)


@pytest.mark.parametrize("kw, words", [
    (dict(temperature=float("inf")), "finite"),
    (dict(method="sbd", block_size=1000), "exceeds the model's 64 positions"),
    (dict(lookup=False, lookup_max=4), "lookup is off"),
    (dict(method="ntp", lookup_max=4), "lookup_max sets the longest prompt-lookup draft, read by greedy "
                                       "method='sbd-verify' with lookup=True; here method='ntp'"),
])
def test_settings_that_would_be_silently_odd_are_refused(plain, kw, words):
    model, tokenizer = plain
    with pytest.raises(SBDError, match=words):
        sbd.generate(model, tokenizer, ["1 2 3"], max_new_tokens=4, **kw)


@pytest.mark.parametrize("argv, words", [
    (["--block-size", "33"], "largest block size a request may ask (32)"),
    (["--no-lookup", "--lookup-max", "4"], "--lookup-max sets the longest prompt-lookup draft, but lookup is off"),
])
def test_serve_refuses_a_configuration_its_requests_would_trip_on(capsys, argv, words):
    pytest.importorskip("fastapi")
    capsys.readouterr()
    assert main(["serve", "--model", "demo", "--port", str(_free_port()), *argv]) == 2
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("sbd: loading")]
    assert len(err) == 1 and err[0].startswith("sbd: error:") and words in err[0], err


@pytest.mark.parametrize("port", ["70000", "-1", "0"])
def test_serve_refuses_a_port_outside_tcps_range(capsys, port):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "demo", "--port", port])
    assert e.value.code == 2 and "between 1 and 65535" in capsys.readouterr().err


def test_serve_refuses_method_sbd_for_a_drafter_not_trained_for_it(capsys):
    pytest.importorskip("fastapi")
    capsys.readouterr()
    assert main(["serve", "--model", "demo-ntp", "--method", "sbd"]) == 2
    assert "not trained for plain SBD" in capsys.readouterr().err


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _options(**fields):
    from sbd.serving.config import Limits
    from sbd.models.facts import ModelFacts
    from sbd.serving.protocol import CompletionRequest, options

    return options(CompletionRequest(prompt="x", **fields), Limits(), ModelFacts(context=None, vocab=400, mask_id=399, block_size=4, eos_ids=(), device=torch.device("cpu")))


@pytest.mark.parametrize("fields, param", [
    (dict(method="sbd-verify", gamma=0.5), "gamma"),
    (dict(method="sbd-verify", proxy="margin"), "proxy"),
    (dict(method="ntp", gamma=0.5), "gamma"),
    (dict(logit_bias={"05": 1.0}), "logit_bias"),
    (dict(logit_bias={"5": 100, "05": -100}), "logit_bias"),
    (dict(lookup=False, lookup_max=4), "lookup_max"),
    (dict(method="ntp", lookup_max=4), "lookup_max"),
    (dict(method="sbd-verify", anchor=True), "anchor"),
    (dict(method="sbd", anchor=True, proxy="margin"), "proxy"),
])
def test_request_fields_nothing_would_read_are_a_400_naming_them(fields, param):
    pytest.importorskip("fastapi")
    from sbd.serving.errors import APIError

    with pytest.raises(APIError) as e:
        _options(**fields)
    assert e.value.status == 400 and e.value.param == param


def test_request_fields_that_are_read_pass():
    pytest.importorskip("fastapi")
    assert _options(method="sbd", gamma=0.5).spec.gamma == 0.5
    assert _options(method="sbd-verify", draft="eb", gamma=0.2, proxy="margin").spec.proxy == "margin"
    assert _options(logit_bias={"5": 1.0}).spec.processing.logit_bias == {5: 1.0}


def test_a_request_omitting_block_size_is_never_refused_for_the_servers_own_default():
    pytest.importorskip("fastapi")
    from sbd.serving.config import Limits
    from sbd.models.facts import ModelFacts
    from sbd.serving.protocol import CompletionRequest, options

    assert options(CompletionRequest(prompt="x"), Limits(), ModelFacts(context=None, vocab=400, mask_id=399, block_size=48, eos_ids=(), device=torch.device("cpu"))).spec.block_size == 48


def test_n_beyond_the_queue_is_a_400_not_a_retry_later():
    pytest.importorskip("fastapi")
    from sbd.serving.errors import APIError
    from sbd.serving.worker import Worker

    model, _ = sbd.load("demo")
    worker = Worker(model, slots=1, capacity=64, max_width=8, max_queue=2,
                    metrics=type("M", (), {"queue": None})())
    row = type("R", (), {"needs": 8, "prompt": [1]})()
    jobs = [type("J", (), {"row": row})() for _ in range(3)]
    with pytest.raises(APIError) as e:
        worker.submit(*jobs)
    assert e.value.status == 400 and e.value.param == "n"


def test_a_shipped_name_shadowed_by_a_local_folder_loads_the_shipped_model_and_says_so(folder, tmp_path,
                                                                                       monkeypatch):
    import shutil

    shutil.copytree(folder, tmp_path / "demo")
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match="names the shipped model and also a folder here"):
        shipped, _ = sbd.load("demo")
    local, _ = sbd.load("./demo")
    assert shipped.config.vocab_size != local.config.vocab_size  # the shipped demo model, then the folder
    assert sbd.load(tmp_path / "demo")[0].config.vocab_size == local.config.vocab_size  # a Path is a folder


def test_a_resumed_runs_metrics_list_each_step_once(tmp_path):
    import json
    from types import SimpleNamespace

    from sbd.training.callbacks import _MetricsLog

    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 5, "loss": 2.0}, {"step": 7, "loss": 1.5}, {"step": 7, "train_runtime": 9.0},  # interrupted at 7
             {"step": 9, "loss": 1.0}]  # past the checkpoint the run resumes from
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    _MetricsLog(path).on_train_begin(None, SimpleNamespace(is_world_process_zero=True, global_step=7), None)
    kept = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert kept == lines[:2]
    assert len({e["step"] for e in kept}) == len(kept)


def test_the_server_refuses_plain_sbd_per_request_for_a_drafter_not_trained_for_it():
    pytest.importorskip("fastapi")
    import asyncio

    from sbd.serving.config import ServerConfig
    from sbd.serving.errors import APIError
    from sbd.serving.protocol import CompletionRequest, options
    from sbd.serving.server import Server

    model, tokenizer = sbd.load("demo-ntp")  # trained for next-token decoding only
    server = Server(model, tokenizer, ServerConfig(model_name="m", max_batch=1))

    async def jobs(method, **fields):
        opts = options(CompletionRequest(prompt="x", method=method, max_tokens=4, **fields), server.limits,
                       server.facts, server.defaults)
        return server.jobs([5, 6, 7], opts)

    with pytest.raises(APIError) as e:
        asyncio.run(jobs("sbd"))
    assert e.value.status == 400 and e.value.param == "method" and "not trained for plain SBD" in str(e.value)
    with pytest.raises(APIError) as e:  # anchored too: its masks were never trained
        asyncio.run(jobs("sbd", anchor=True))
    assert e.value.status == 400 and "never trained" in str(e.value)
    assert len(asyncio.run(jobs("ntp"))) == 1
