"""`sbd.load`, the conformance probe's refusals, and `sbd.add_mask_token`."""

import json

import pytest
import torch

import sbd
from sbd import SBDError
from sbd.models import tiny
from sbd.models.probe import probe_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    tiny.create(path, arch="qwen3", hidden=32, layers=2, heads=4, kv_heads=2, vocab_size=300)
    return path


def test_load_returns_a_working_model(saved):
    model, tokenizer = sbd.load(saved)
    assert model.config._attn_implementation == "sdpa" and not model.training
    assert model.config.sbd_mask_token_id == tokenizer.mask_token_id
    out = sbd.generate(model, tokenizer, ["hello"], method="sbd", max_new_tokens=5)
    assert len(out.token_ids[0]) <= 5


def test_load_refuses_what_is_not_a_model(tmp_path, saved):
    with pytest.raises(SBDError, match="does not exist"):
        sbd.load(tmp_path / "missing")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(SBDError, match="not a directory"):
        sbd.load(tmp_path / "file.txt")
    with pytest.raises(SBDError, match="no config.json"):
        sbd.load(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(SBDError, match="not valid JSON"):
        sbd.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(SBDError, match="no tokenizer files"):
        sbd.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(SBDError, match="cannot load"):
        sbd.load(tmp_path)


def test_missing_tokenizer_files_are_named_in_one_line(tmp_path, saved):
    for f in saved.iterdir():
        if not f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(SBDError, match="no tokenizer files: expected tokenizer.json") as err:
        sbd.load(tmp_path)
    assert "\n" not in str(err.value)


def test_load_reads_safetensors_only(tmp_path, saved):
    for f in saved.iterdir():
        if f.suffix != ".safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    torch.save({}, tmp_path / "pytorch_model.bin")
    with pytest.raises(SBDError, match="safetensors"):
        sbd.load(tmp_path)


class Drops(torch.nn.Module):
    """Wraps a model and drops one keyword argument of every call (a model that ignores it)."""

    def __init__(self, inner, drop):
        super().__init__()
        self.inner, self.drop, self.config = inner, drop, inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, **kw):
        kw.pop(self.drop, None)
        return self.inner(**kw)


@pytest.mark.parametrize("drop,reason", [
    ("attention_mask", "ignores non-causal"),
    ("position_ids", "ignores position_ids"),
    ("past_key_values", "conformance probe"),
])
def test_probe_refuses_a_model_that_ignores_an_input(llama, drop, reason):
    with pytest.raises(SBDError, match=reason):
        probe_model(Drops(llama, drop))


def test_probe_refuses_eager_attention_that_misreads_bool_masks(tokenizer):
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_config(tiny.tiny_config("llama", vocab_size=len(tokenizer)),
                                             attn_implementation="eager")
    with pytest.raises(SBDError, match="4-D bool attention mask"):
        probe_model(eager)


def _model_for(tokenizer):
    return tiny.random_model(tiny.tiny_config("llama", vocab_size=len(tokenizer), hidden=32))


def test_add_mask_token_reuses_the_tokenizers_mask_token():
    tok = tiny.build_tokenizer(vocab_size=300)
    model = _model_for(tok)
    n = model.get_input_embeddings().num_embeddings
    assert sbd.add_mask_token(model, tok) == tok.mask_token_id
    assert model.get_input_embeddings().num_embeddings == n
    assert sbd.add_mask_token(model, tok) == tok.mask_token_id  # idempotent


def test_add_mask_token_reuses_a_reserved_token():
    from transformers import PreTrainedTokenizerFast

    base = tiny.build_tokenizer(vocab_size=300)
    tok = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, eos_token=tiny.EOS)
    tok.add_special_tokens({"additional_special_tokens": ["<|reserved_special_token_0|>", "<|reserved_special_token_1|>"]})
    model = tiny.random_model(tiny.tiny_config("llama", vocab_size=len(tok), hidden=32))
    mask_id = sbd.add_mask_token(model, tok)
    assert mask_id == tok.convert_tokens_to_ids("<|reserved_special_token_0|>")
    assert model.get_input_embeddings().num_embeddings == len(tok)


def test_add_mask_token_adds_one_and_survives_save_and_load(tmp_path):
    from transformers import PreTrainedTokenizerFast

    base = tiny.build_tokenizer(vocab_size=300)
    tok = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, eos_token=tiny.EOS)
    tok.add_special_tokens({"additional_special_tokens": []})
    model = tiny.random_model(tiny.tiny_config("llama", vocab_size=len(tok), hidden=32))
    n = model.get_input_embeddings().num_embeddings
    existing = tok.convert_tokens_to_ids(tiny.MASK)  # the BPE vocabulary has it, but not as a mask token
    mask_id = sbd.add_mask_token(model, tok)
    assert tok.mask_token == tiny.MASK and mask_id == existing and model.config.sbd_mask_token_id == mask_id
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = sbd.load(tmp_path)
    assert loaded.config.sbd_mask_token_id == mask_id and loaded_tok.mask_token_id == mask_id
    assert loaded.get_input_embeddings().num_embeddings == n


def test_add_mask_token_resizes_when_the_token_is_new():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"a": 0, "b": 1, "</s>": 2}, unk_token="a"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>")
    model = tiny.random_model(tiny.tiny_config("llama", vocab_size=3, hidden=32))
    mask_id = sbd.add_mask_token(model, tok)
    assert mask_id == 3 and tok.mask_token == "<|mask|>"
    assert model.get_input_embeddings().num_embeddings == 4
    assert model.get_output_embeddings().weight.shape[0] == 4


def test_an_added_mask_row_is_deterministic_the_mean_of_the_others(monkeypatch):
    from transformers import PreTrainedTokenizerFast

    from sbd.models import folders

    monkeypatch.setattr(folders, "MASK_TOKEN", "<|a_new_mask|>")  # not in the vocabulary: a row is added
    base = tiny.build_tokenizer(vocab_size=300)
    rows = []
    for _ in range(2):
        tok = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, eos_token=tiny.EOS)
        model = tiny.random_model(tiny.tiny_config("llama", vocab_size=len(tok), hidden=32), seed=1)
        n = model.get_input_embeddings().num_embeddings
        mask_id = sbd.add_mask_token(model, tok)
        emb = model.get_input_embeddings().weight
        assert mask_id >= n and torch.allclose(emb[mask_id], emb[:n].mean(0))
        rows.append(emb[mask_id].clone())
    assert torch.equal(rows[0], rows[1])
