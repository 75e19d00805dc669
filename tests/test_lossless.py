"""Linear layers held exactly in sbd's int4/int8 formats (`sbd.models.lossless`, what `sbd.load` does by
default on a CPU): weights that came from a GGUF's Q4_1 and Q8_0 tensors are held in those forms bit for bit,
every other layer stays float, and sbd-verify gives exactly NTP's tokens of the held model."""

import pytest
import torch
from torch import nn

import sbd
from sbd.models import extension, lossless, quantized, tiny

from conftest import DEVICE
from test_quantized import KW, _compare, _looping_prompts, _nearly_tied_model

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="sbd's products run on a CPU only")


@pytest.fixture(scope="module", autouse=True)
def ext():
    try:
        return extension.build()
    except RuntimeError:
        pytest.skip("no C++ compiler here: sbd's extension cannot be built (the weights stay float)")


def _as_if_from_gguf(model, added_rows: int = 1):
    """Every base linear layer's weights put on Q4_1's grid (w = q·d + m per 32 inputs, float16 d and m), the
    output layer's on Q8_0's (w = q·d) but for its last `added_rows` rows (tokens added after a file's
    vocabulary, as sbd adds its mask token): a model as a GGUF file loads."""
    head = model.get_output_embeddings()
    with torch.no_grad():
        for _, lin in quantized._base_linears(model):
            w = lin.weight
            if lin is head:
                kept = len(w) - added_rows
                w[:kept] = quantized.int8_weights(*quantized.sbd_groups(w[:kept] * 3, "int8"))
            else:
                w.copy_(quantized.int4_weights(*quantized.sbd_groups(w, "int4")))
    return model


def _weights(layer) -> torch.Tensor:
    """The weights a layer computes with, read through its product: the identity's rows give them back."""
    with torch.no_grad():
        return layer(torch.eye(layer.in_features)).t() - (0 if layer.bias is None else layer.bias[:, None])


def test_weights_from_q4_1_and_q8_0_are_held_in_those_forms_bit_for_bit():
    model = _as_if_from_gguf(_nearly_tied_model())
    before = {name: lin.weight.detach().clone() for name, lin in quantized._base_linears(model)}
    done = lossless.pack(model)
    assert done == {name: "int8" if name == "lm_head" else "int4" for name in before}
    assert quantized.weights_format(model) == "int4" and quantized.row_invariant(model)
    head = model.get_output_embeddings()
    assert head.qweight.shape[0] == 511 and head.tail.shape == (1, 576)  # the added row stays float32
    for name, module in model.named_modules():
        if name in before:
            assert torch.equal(_weights(module), before[name]), name
    index = torch.tensor([[0, 510], [511, 3]])  # the sampler head reads the output layer's rows by token
    assert torch.equal(head.rows(index), before["lm_head"][index])


def test_a_float_model_and_an_inexact_layer_stay_float():
    model = _nearly_tied_model()
    assert lossless.pack(model) == {}
    assert not any(isinstance(m, quantized.QuantizedLinear) for m in model.modules())
    model = _as_if_from_gguf(_nearly_tied_model())
    w = model.model.layers[1].mlp.up_proj.weight
    with torch.no_grad():  # one weight one float32 step off the grid
        w[7, 100] = torch.nextafter(w[7, 100], torch.tensor(1.0))
    done = lossless.pack(model)
    assert "model.layers.1.mlp.up_proj" not in done and len(done) == 14
    assert type(model.model.layers[1].mlp.up_proj) is nn.Linear
    assert quantized.weights_format(model) is None and not quantized.row_invariant(model)


def test_more_added_rows_than_the_tail_takes_keep_the_output_layer_float():
    model = _as_if_from_gguf(_nearly_tied_model(), added_rows=lossless.TAIL + 1)
    done = lossless.pack(model)
    assert "lm_head" not in done and len(done) == 14
    model = _as_if_from_gguf(_nearly_tied_model(), added_rows=lossless.TAIL)
    assert lossless.pack(model)["lm_head"] == "int8"
    assert model.get_output_embeddings().tail.shape == (lossless.TAIL, 576)


def test_the_held_model_is_its_float_self_and_sbd_verify_gives_its_ntp_tokens_alone_and_batched():
    """The same weights: the logits differ from the float model's only by the order of the sums (a few
    float32 steps), and sbd-verify's committed positions are NTP's one-token forwards bit for bit."""
    model = _as_if_from_gguf(_nearly_tied_model())
    float_model = _as_if_from_gguf(_nearly_tied_model())
    lossless.pack(model)
    ids = torch.tensor([_looping_prompts(1, 511, seed=3)[0][:40]])
    with torch.no_grad():
        want, got = float_model(ids).logits, model(ids).logits
    assert 0 < (got - want).abs().max() < 1e-5 * want.abs().max()
    prompts = _looping_prompts(3, 511, seed=7)
    compared, wide, equal = _compare(model, prompts, **KW)
    assert equal and wide >= 20, (compared, wide)
    ntp = sbd.generate(model, None, prompts, method="ntp", **KW)
    batched = sbd.generate(model, None, prompts, method="sbd-verify", block_size=4, lookup=True, **KW)
    assert batched.token_ids == ntp.token_ids


def test_load_holds_exact_layers_by_default_and_float_keeps_them_float(tmp_path):
    model, tok = tiny.create(tmp_path / "m", hidden=64, layers=1, heads=2, kv_heads=1)
    _as_if_from_gguf(model, added_rows=1)
    model.save_pretrained(tmp_path / "m")
    held, _ = sbd.load(tmp_path / "m")
    assert quantized.weights_format(held) == "int4"
    plain, _ = sbd.load(tmp_path / "m", weights="float")
    assert not any(isinstance(m, quantized.QuantizedLinear) for m in plain.modules())
    prompt = [[5, 9, 13, 5, 9, 13, 5, 9]]
    assert sbd.generate(held, None, prompt, max_new_tokens=12).token_ids == sbd.generate(
        held, None, prompt, method="ntp", max_new_tokens=12).token_ids
    with pytest.raises(sbd.SBDError, match="weights='int2'.*\"float\""):
        sbd.load(tmp_path / "m", weights="int2")


def test_training_a_held_model_is_refused_in_one_line(tmp_path):
    """sbd's products pass no gradients back: an adapter trained over them would learn from a cut graph."""
    model, tok = tiny.create(tmp_path / "m", hidden=64, layers=1, heads=2, kv_heads=1)
    _as_if_from_gguf(model, added_rows=1)
    model.save_pretrained(tmp_path / "m")
    held, tok = sbd.load(tmp_path / "m")
    with pytest.raises(sbd.SBDError, match="gradients do not pass through them; load it with weights=\"float\""):
        sbd.SBDTrainer(model=held, train_dataset=[{"input_ids": [1, 2, 3], "prompt_length": 1}], processing_class=tok)
