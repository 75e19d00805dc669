"""The decoding spec: one place resolves every entry point's settings (`sbd.decoding.spec`), its refusals
are spelled as each interface writes a setting, and a spec decodes exactly as the keywords it came from."""

from __future__ import annotations

import pytest
import torch
from conftest import _model, hf_greedy, random_prompts

import sbd
from sbd.decoding.draft_policy import DraftOptions
from sbd.decoding.spec import OPTIONS, DecodeSpec, SpecError, spell
from sbd.models.facts import ModelFacts

FACTS = ModelFacts(context=64, vocab=100, mask_id=99, block_size=4, eos_ids=(), device=torch.device("cpu"))


@pytest.mark.parametrize("given, field, python, cli, http", [
    (dict(method="ntp", lookup=True), "lookup", "lookup=True applies to method='sbd-verify'",
     "--lookup applies to --method sbd-verify", '"lookup": true applies to "method": "sbd-verify"'),
    (dict(method="ntp", gamma=0.5), "gamma", "gamma=0.5 sets the EB rule", "--gamma 0.5 sets the EB rule",
     '"gamma": 0.5 sets the EB rule'),
    (dict(lookup=False, lookup_max=4), "lookup_max", "lookup_max sets the longest", "--lookup-max sets the longest",
     "lookup_max sets the longest"),
    (dict(max_new_tokens=0), "max_new_tokens", "max_new_tokens must be", "--max-new-tokens must be",
     "max_tokens must be"),
    (dict(draft="adaptive", temperature=0.5), "draft", "draft='adaptive' is greedy only",
     "--draft adaptive is greedy only", '"draft": "adaptive" is greedy only'),
    (dict(anchor=True), "anchor", "anchor=True applies to method='sbd'", "--anchor applies to --method sbd",
     '"anchor": true applies to "method": "sbd"'),
])
def test_a_refusal_names_its_field_in_each_interfaces_words(given, field, python, cli, http):
    for check in (lambda: DecodeSpec.check(**given), lambda: DecodeSpec.build(FACTS, **given)):
        with pytest.raises(SpecError) as e:
            check()
        assert e.value.field == field and "\n" not in str(e.value)
        assert python in str(e.value) and cli in e.value.spelled("cli") and http in e.value.spelled("http")
    assert e.value.param == ("max_tokens" if field == "max_new_tokens" else field)


def test_spelling_keeps_plain_text_and_spells_values():
    assert spell("plain text, {x} and {x=True}", "cli") == "plain text, --x and --x"
    assert spell("{lookup=False} {method=sbd-verify} {gamma=inf}", "cli") == "--no-lookup --method sbd-verify --gamma inf"
    assert spell("{method=sbd-verify}", "python") == "method='sbd-verify'"


def test_an_unknown_option_is_refused_naming_it():
    with pytest.raises(sbd.SBDError, match="unknown decoding option lookahead"):
        DecodeSpec.check(lookahead=3)
    assert "draft_options" in OPTIONS and "top_p" in OPTIONS and "fallback" not in OPTIONS


def test_build_fills_the_defaults_where_they_are_exact():
    recorded = sbd.decoding.defaults.VerifySettings("adaptive", True, 9, (2,))
    greedy = DecodeSpec.build(FACTS, defaults=recorded)
    assert (greedy.draft, greedy.lookup, greedy.lookup_max, greedy.tree, greedy.block_size) == ("adaptive", True, 9,
                                                                                                (2,), 4)
    sampled = DecodeSpec.build(FACTS, defaults=recorded, temperature=0.7)  # sampling: the plain settings
    assert (sampled.draft, sampled.lookup, sampled.tree) == ("block", False, None)
    static = DecodeSpec.build(FACTS, defaults=recorded, static_shapes=True)  # fixed widths take no tree
    assert static.tree is None and static.lookup
    with pytest.raises(SpecError, match="exceeds the model's 64 positions"):
        DecodeSpec.build(FACTS, block_size=65)
    with pytest.raises(SpecError, match="no SBD mask token") as e:
        DecodeSpec.build(ModelFacts(None, 100, None, 4, (), torch.device("cpu")))
    assert e.value.field == "method"
    assert DecodeSpec.build(ModelFacts(None, 100, None, 4, (), torch.device("cpu")), method="ntp").method == "ntp"


def test_a_spec_decodes_as_the_keywords_it_came_from():
    model = _model("llama")
    prompts = random_prompts(3, model.config.vocab_size, seed=4)
    kw = dict(method="sbd-verify", block_size=4, max_new_tokens=12, lookup=True)
    spec = DecodeSpec.resolve(model, **kw)
    a, b = sbd.generate(model, None, prompts, spec), sbd.generate(model, None, prompts, **kw)
    assert a.token_ids == b.token_ids == [hf_greedy(model, p, 12) for p in prompts]
    assert a.nfe == b.nfe and a.settings == b.settings == spec.settings
    with pytest.raises(sbd.SBDError, match="not both"):
        sbd.generate(model, None, prompts, spec, lookup=False)


def test_draft_options_ride_in_the_spec():
    model = _model("llama")
    spec = DecodeSpec.resolve(model, block_size=4, max_new_tokens=8, draft_options=DraftOptions(reuse_leftover=True))
    assert spec.draft_options.reuse_leftover
    with pytest.raises(SpecError, match="DraftOptions"):
        DecodeSpec.check(draft_options={"reuse_leftover": True})


def test_a_model_without_weights_has_the_same_facts_and_server_configuration():
    """`load(weights=False)`: what `sbd serve --replicas` checks its options against, without a second load."""
    from sbd.models.loading import load
    from sbd.serving.config import server_config

    full, tok = load("demo")
    shape, tok2 = load("demo", weights=False)
    assert next(shape.parameters()).device.type == "meta"
    same = lambda f: (f.context, f.vocab, f.mask_id, f.block_size, f.eos_ids)  # noqa: E731
    assert same(ModelFacts.of(full, tok)) == same(ModelFacts.of(shape, tok2))
    assert server_config(full, model_path="demo", tokenizer=tok) == server_config(shape, model_path="demo",
                                                                                  tokenizer=tok2)
    assert DecodeSpec.resolve(full) == DecodeSpec.resolve(shape)


# -- a setting given that the chosen decoding does not read: refused in one line naming it, by one rule ----
UNREAD = [
    (dict(method="ntp", draft="block"), "draft"),
    (dict(method="sbd", draft="block"), "draft"),
    (dict(method="ntp", block_size=8), "block_size"),
    (dict(method="ntp", lookup=False), "lookup"),
    (dict(method="sbd", tree="chain"), "tree"),
    (dict(method="sbd-verify", temperature=0.7, tree="chain"), "tree"),
    (dict(method="sbd-verify", draft="eb", lookup=False), "lookup"),
    (dict(method="ntp", anchor=False), "anchor"),
    (dict(method="ntp", reveal_per_forward=2), "reveal_per_forward"),
    (dict(method="ntp", draft_options=DraftOptions()), "draft_options"),
    (dict(method="sbd", top_p=1.0), "top_p"),
    (dict(method="sbd", logprobs=0), "logprobs"),
    (dict(method="sbd", temperature=0.5, top_p=0.9), "top_p"),
    (dict(method="sbd-verify", draft="block", gamma=0.2), "gamma"),
]


@pytest.mark.parametrize("given, field", UNREAD)
def test_a_setting_the_decoding_does_not_read_is_refused_naming_it(given, field):
    for check in (lambda: DecodeSpec.check(**given), lambda: DecodeSpec.build(FACTS, **given)):
        with pytest.raises(SpecError) as e:
            check()
        assert e.value.field == field and "\n" not in str(e.value)
        assert str(e.value).startswith(field), str(e.value)  # named first, as the user wrote it


def test_settings_left_to_defaults_and_a_seed_with_greedy_decoding_are_never_refused():
    recorded = sbd.decoding.defaults.VerifySettings("adaptive", True, 9, (2,))
    for method in ("ntp", "sbd", "sbd-verify"):  # the recorded drafting defaults trigger nothing
        DecodeSpec.build(FACTS, defaults=recorded, method=method)
    assert DecodeSpec.build(FACTS, method="ntp", temperature=0, top_p=0.9).processing.top_p == 0.9  # as seed
    model = _model("llama")
    out = sbd.generate(model, None, [[5, 6, 7]], method="ntp", max_new_tokens=3, seed=11)  # greedy: seed unread
    assert out.token_ids == [hf_greedy(model, [5, 6, 7], 3)]
    with pytest.raises(SpecError, match="block_size"):  # the library refuses what the CLI and server do
        sbd.generate(model, None, [[5, 6, 7]], method="ntp", max_new_tokens=3, block_size=8)


def test_the_eb_rule_refused_under_sbd_verify_names_the_draft_the_model_resolved():
    recorded = sbd.decoding.defaults.VerifySettings("adaptive", True, 9, (2,))
    with pytest.raises(SpecError) as e:
        DecodeSpec.build(FACTS, defaults=recorded, gamma=0.1)
    cli = e.value.spelled("cli")
    assert "--draft adaptive (this model's default)" in cli and "--draft block" not in cli, cli
    with pytest.raises(SpecError) as e:
        DecodeSpec.build(FACTS, gamma=0.1)
    assert "--draft block (this model's default)" in e.value.spelled("cli")
    with pytest.raises(SpecError) as e:
        DecodeSpec.build(FACTS, defaults=recorded, gamma=0.1, draft="block")
    assert "--draft block" in e.value.spelled("cli") and "default" not in e.value.spelled("cli")
