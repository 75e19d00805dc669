"""sbd-verify's defaults (SPEC §7 "Defaults", sbd.decoding.defaults): what a model records is what
`generate` runs with when nothing is set, exactly as if the same settings were given; every lever can be
switched off; sampling keeps the plain settings; the CLI, the server and lm-eval read the same rule."""

from __future__ import annotations

import argparse

import torch

import pytest
from conftest import _model, attach_random_adapter, hf_greedy

import sbd
from sbd.drafters import adapter as adapters
from sbd.decoding.defaults import GENERAL, PLAIN, VerifySettings, model_defaults
from sbd.decoding.spec import DecodeSpec
from sbd.models.facts import ModelFacts
from sbd.errors import SBDError

PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]  # repeats: prompt lookup finds matches


def fresh(arch="llama", record=None, where="adapter"):
    """A tiny model of its own (not the shared cached one) with an adapter, recording `record`."""
    model = _model.__wrapped__(arch)
    ad = attach_random_adapter(model, seed=3)
    if record is not None and where == "adapter":
        ad.config.decoding = record
    elif record is not None:
        model.config.sbd_decoding = record
    return model


def run(model, **kw):
    """tokens, forwards, accepted, lookup_accepted and the width of every forward."""
    widths = []
    r = sbd.generate(model, None, [PROMPT], method="sbd-verify", max_new_tokens=24, eos_token_ids=[],
                     observer=lambda rec: widths.append(rec.input_ids.shape[1]), **kw)
    return (r.token_ids, r.nfe, r.accepted, r.lookup_accepted, widths), r.settings


def test_no_record_is_the_general_default_and_equals_explicit_plain_settings():
    model = fresh()
    got, settings = run(model)
    assert settings == GENERAL == VerifySettings("block", False, 16, None)
    assert got == run(model, draft="block", lookup=False, tree="chain")[0]


@pytest.mark.parametrize("where", ["adapter", "config"])
def test_a_recorded_configuration_is_run_as_if_given(where):
    model = fresh(record={"draft": "block", "lookup": True, "lookup_max": 5, "tree": [2]}, where=where)
    got, settings = run(model)
    assert settings == VerifySettings("block", True, 5, (2,))
    assert got == run(model, draft="block", lookup=True, lookup_max=5, tree=(2,))[0]
    plain = run(model, lookup=False, tree="chain")[0]
    assert got[4] != plain[4]  # the record changed the forwards (tree nodes, lookup drafts)
    hf = hf_greedy(model, PROMPT, 24)
    assert got[0][0][: len(hf)] == plain[0][0][: len(hf)] == hf  # and never the tokens


def test_the_adapter_record_wins_over_the_config_and_each_lever_switches_off():
    model = fresh(record={"lookup": True, "tree": "3,2"})
    model.config.sbd_decoding = {"draft": "adaptive"}
    assert model_defaults(model) == VerifySettings("block", True, 16, (3, 2))
    _, s = run(model, lookup=False)
    assert s == VerifySettings("block", False, 16, (3, 2))
    _, s = run(model, tree="chain")
    assert s == VerifySettings("block", True, 16, None)
    _, s = run(model, tree=())
    assert s.tree is None


def test_a_recorded_priced_first_draft_reaches_the_draft_options_unless_the_caller_gives_its_own():
    from sbd.decoding.draft_policy import DraftOptions

    model = fresh(record={"draft": "adaptive", "first_draft": "priced"})
    assert model_defaults(model).price_first_draft
    assert DecodeSpec.resolve(model, method="sbd-verify").draft_options.price_first_draft
    given = DraftOptions(price_first_draft=False)
    assert DecodeSpec.resolve(model, method="sbd-verify", draft_options=given).draft_options is given
    assert not DecodeSpec.resolve(fresh(record={"draft": "adaptive"}), method="sbd-verify").draft_options.price_first_draft
    got, settings = run(model)
    assert "first draft priced" in settings.describe()
    assert got == run(model, draft="adaptive", draft_options=DraftOptions(price_first_draft=True))[0]


def test_sampling_and_other_methods_take_the_plain_settings():
    model = fresh(record={"draft": "adaptive", "lookup": True, "tree": [2]})
    r = sbd.generate(model, None, [PROMPT], method="sbd-verify", max_new_tokens=8, temperature=0.8, seed=1)
    assert r.settings == PLAIN
    assert DecodeSpec.resolve(model, method="sbd").settings is None  # the other methods: no drafting settings
    assert (DecodeSpec.resolve(model, method="ntp").draft, DecodeSpec.resolve(model, method="ntp").lookup) == (
        PLAIN.draft, PLAIN.lookup)
    # draft="eb" takes neither lookup nor a tree; fixed shapes take no tree
    assert DecodeSpec.resolve(model, method="sbd-verify", draft="eb").settings == VerifySettings("eb", False, 16, None)
    assert DecodeSpec.resolve(model, method="sbd-verify", static_shapes=True).tree is None


@pytest.mark.parametrize("record, words", [
    ({"draft": "eb"}, "default draft"),
    ({"lookup": "yes"}, "default lookup"),
    ({"lookup_max": 0}, "lookup_max"),
    ({"tree": [0]}, "tree"),
    ({"speed": 3}, "unknown decoding default"),
    ({"first_draft": "half"}, "default first_draft"),
    ("adaptive", "not a JSON object"),
])
def test_a_bad_record_is_one_line_naming_where(record, words):
    model = fresh(record=record)
    with pytest.raises(SBDError, match=words) as e:
        sbd.generate(model, None, [PROMPT], method="sbd-verify", max_new_tokens=4)
    assert "adapter_config.json" in str(e.value) and "\n" not in str(e.value)


def test_the_record_survives_save_and_load(tmp_path):
    model = fresh(record={"lookup": True, "tree": [2, 1]})
    adapters.save(model, tmp_path / "ad")
    other = _model.__wrapped__("llama")
    adapters.load(other, tmp_path / "ad")
    assert model_defaults(other) == VerifySettings("block", True, 16, (2, 1))


FACTS = ModelFacts(context=None, vocab=400, mask_id=399, block_size=4, eos_ids=(), device=torch.device("cpu"))


def test_cli_options_mean_the_default_when_left_out():
    from sbd.cli.drafting import add_drafting_options, drafting_kwargs

    p = argparse.ArgumentParser()
    add_drafting_options(p)
    assert drafting_kwargs(p.parse_args([])) == {}
    assert drafting_kwargs(p.parse_args(["--no-lookup", "--tree", "chain", "--draft", "block"])) == {
        "lookup": False, "tree": "chain", "draft": "block"}
    assert drafting_kwargs(p.parse_args(["--lookup", "--lookup-max", "9", "--tree", "3,2"])) == {
        "lookup": True, "lookup_max": 9, "tree": "3,2"}


def test_server_requests_take_the_server_defaults_and_may_switch_them():
    from sbd.serving.config import Limits
    from sbd.serving.server import server_defaults
    from sbd.serving.errors import APIError
    from sbd.serving.protocol import CompletionRequest, options

    model = fresh(record={"lookup": True, "tree": [2]})
    limits = Limits()
    defaults = server_defaults(model, limits)
    assert defaults == VerifySettings("block", True, 16, (2,))
    assert server_defaults(model, Limits(lookup=False, tree="chain", draft="adaptive")) == VerifySettings(
        "adaptive", False, 16, None)

    def opts(**fields):
        return options(CompletionRequest(prompt="x", **fields), limits, FACTS, defaults).spec

    o = opts()
    assert (o.draft, o.lookup, o.lookup_max, o.tree) == ("block", True, 16, (2,))
    o = opts(tree="chain", lookup=False)
    assert (o.lookup, o.tree) == (False, None)
    assert opts(lookup_max=7).lookup_max == 7
    with pytest.raises(APIError) as e:  # nothing would read it: a 400, not silence
        opts(lookup=False, lookup_max=7)
    assert e.value.param == "lookup_max"
    assert opts(tree=[3, 1]).tree == (3, 1) and opts(tree="3,1").tree == (3, 1)
    o = opts(temperature=0.7)  # sampling: the plain settings
    assert (o.draft, o.lookup, o.tree) == ("block", False, None)
    for bad in ({"tree": [2], "temperature": 0.7}, {"tree": "x"}, {"tree": [0]}, {"lookup_max": 0},
                {"tree": [2], "draft": "eb"}, {"tree": [2], "method": "ntp"}):
        with pytest.raises(APIError) as e:
            opts(**bad)
        assert e.value.status == 400 and e.value.param in ("tree", "lookup_max")


def test_server_answers_with_a_recorded_tree_equal_offline_generate(tokenizer):
    """Through the app with concurrent requests: the recorded tree + lookup run in the server, and every
    answer equals offline `sbd.generate` with the model's defaults (and HF greedy)."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from concurrent.futures import ThreadPoolExecutor

    from test_serve import LiveServer

    from sbd.serving.app import ServerConfig, create_app

    model = fresh(record={"lookup": True, "tree": [2, 1]})
    server = LiveServer(create_app(model, tokenizer, ServerConfig(model_name="m", max_batch=4)))
    prompts = [PROMPT, PROMPT[:7], [9, 8, 7, 9, 8, 7, 9], [11, 12, 13, 14]]
    try:
        def ask(p):
            r = httpx.post(server.url + "/v1/completions", json={"prompt": p, "max_tokens": 16}, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(ask, prompts * 2))
        wide = httpx.post(server.url + "/v1/completions",
                          json={"prompt": PROMPT, "max_tokens": 8, "tree": [32] * 8, "block_size": 32}, timeout=60)
    finally:
        server.stop()
    for p, text in zip(prompts * 2, texts):
        r = sbd.generate(model, tokenizer, [p], method="sbd-verify", max_new_tokens=16)
        assert r.settings.tree == (2, 1) and r.settings.lookup
        assert r.token_ids[0] == hf_greedy(model, p, 16)
        assert text == r.texts[0] and text
    assert wide.status_code == 400 and "wide" in wide.json()["error"]["message"]


def test_lm_eval_model_takes_the_defaults_and_its_own_switches(tokenizer):
    pytest.importorskip("lm_eval")
    from sbd.evaluation.lm_eval_model import SBDLM

    model = fresh(record={"lookup": True, "tree": [2]})
    lm = SBDLM(pretrained=model, tokenizer=tokenizer, method="sbd-verify", device="cpu")
    assert lm.block_size == 4  # the adapter's trained size
    assert lm.stats()["drafting"] == {"draft": "block", "lookup": True, "lookup_max": 16, "tree": [2],
                                      "first_draft": "block"}
    lm = SBDLM(pretrained=model, tokenizer=tokenizer, method="sbd-verify", device="cpu", lookup="false", tree="3:2")
    assert lm.settings == VerifySettings("block", False, 16, (3, 2))
    with pytest.raises(SBDError, match="true or false"):
        SBDLM(pretrained=model, tokenizer=tokenizer, method="sbd-verify", device="cpu", lookup="maybe")
    with pytest.raises(SBDError, match="tree"):
        SBDLM(pretrained=model, tokenizer=tokenizer, method="sbd-verify", device="cpu", tree="0")


def test_generate_reports_no_settings_for_other_methods():
    model = fresh(record={"lookup": True})
    assert sbd.generate(model, None, [PROMPT], method="ntp", max_new_tokens=4).settings is None
    with pytest.raises(SBDError, match="lookup=True applies"):
        sbd.generate(model, None, [PROMPT], method="ntp", max_new_tokens=4, lookup=True)


def test_a_full_model_may_record_its_block_size():
    from sbd.models.facts import default_block_size

    model = _model.__wrapped__("llama")
    assert default_block_size(model) == 16  # nothing recorded
    model.config.sbd_decoding = {"block_size": 4}
    assert default_block_size(model) == 4
    widths = []
    sbd.generate(model, None, [PROMPT], method="sbd-verify", max_new_tokens=8, eos_token_ids=[],
                 observer=lambda rec: widths.append(rec.input_ids.shape[1]))
    assert max(widths[1:]) == 2 * 4  # head + 3 draft tokens + 4 masks: blocks of the recorded size
    attach_random_adapter(model, seed=1)  # an adapter's trained size comes first
    adapters.adapter_of(model).config.block_size = 6
    assert default_block_size(model) == 6
    adapters.detach(model)
    model.config.sbd_decoding = {"block_size": 0}
    with pytest.raises(SBDError, match="block_size is an integer >= 1"):
        default_block_size(model)


# -- masks never trained for drafting: plain steps while their drafts fail --------------------------------
def test_untrained_masks_step_aside_to_plain_steps_and_keep_the_tokens():
    from sbd.decoding.defaults import UNTRAINED
    from sbd.decoding.draft_policy import DraftOptions

    model = _model.__wrapped__("llama")  # no adapter and no record of SBD training: untrained masks

    def decode(**kw):
        widths = []
        r = sbd.generate(model, None, [PROMPT], method="sbd-verify", max_new_tokens=160, eos_token_ids=[],
                         block_size=4, observer=lambda rec: widths.append(rec.input_ids.shape[1]), **kw)
        return r, widths[1:]  # (the first forward is the prefill)

    assert model_defaults(model) == UNTRAINED
    out, widths = decode()
    assert out.settings.fallback and out.token_ids[0] == hf_greedy(model, PROMPT, 160)
    late = widths[len(widths) // 2:]  # long after the first refusals: a probe (masks, then a draft) per 16
    assert sum(w > 1 for w in late) <= 2 * (len(late) // DraftOptions().probe_every + 1) < len(late) // 2
    chosen, widths_b = decode(draft="block")  # whole blocks asked for: no fallback
    assert not chosen.settings.fallback and chosen.token_ids == out.token_ids and all(w > 1 for w in widths_b)


def test_a_drafter_that_records_its_training_drafts_every_forward():
    model = fresh()  # a random adapter that says it was trained: its drafts are never switched off
    assert not model_defaults(model).fallback
    _, widths, = run(model, block_size=4)[0][3:]
    assert all(w > 1 for w in widths[1:])


def test_server_requests_of_an_untrained_model_fall_back_unless_they_choose_a_draft():
    from sbd.serving.config import Limits
    from sbd.serving.server import server_defaults
    from sbd.serving.protocol import CompletionRequest, options

    model = _model.__wrapped__("llama")
    defaults = server_defaults(model, Limits())
    assert defaults.fallback and not server_defaults(model, Limits(draft="block")).fallback
    assert options(CompletionRequest(prompt="x"), Limits(), FACTS, defaults).spec.fallback
    assert not options(CompletionRequest(prompt="x", draft="block"), Limits(), FACTS, defaults).spec.fallback
    assert not options(CompletionRequest(prompt="x", temperature=0.5), Limits(), FACTS, defaults).spec.fallback
