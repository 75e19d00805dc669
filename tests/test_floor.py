"""The memory floor of a forward (`sbd.benchmarking.floor`): the bytes a model reads as loaded, counted by
hand on tiny models (float32, tied embeddings, int8 and int4 layers), and `sbd forward-cost` reporting every
measured forward against it."""

import json

import pytest
import torch

from sbd.benchmarking.floor import Floor, floor_of, kv_bytes_per_position, read_bandwidth, weight_bytes
from sbd.models import quantized, tiny

H, V, I = 64, 320, 128  # hidden, vocab, intermediate of `_model`


def _model(tie: bool):
    cfg = tiny.tiny_config("llama", vocab_size=V, hidden=H, layers=2, heads=4, kv_heads=2, context=128)
    cfg.intermediate_size, cfg.tie_word_embeddings = I, tie
    return tiny.random_model(cfg, seed=0)


def _linear_weights(layers=2) -> int:
    q, kv = H, H // 2  # 4 heads of 16; 2 key/value heads
    return layers * (H * q * 2 + H * kv * 2 + 3 * H * I)


@pytest.mark.parametrize("tie", [False, True])
def test_float_weights_count_every_weight_once_and_the_embeddings_only_as_the_output_layer(tie):
    model = _model(tie)
    norms = (2 * 2 + 1) * H  # two per layer and the last
    rotary = sum(b.numel() for b in model.buffers())
    want = 4 * (_linear_weights() + V * H + norms + rotary)  # the output layer: its own, or the shared embeddings
    assert weight_bytes(model) == want


def test_quantized_weights_count_their_int_values_and_scales():
    model = _model(False)
    float_bytes = weight_bytes(model)
    quantized.quantize(model, "int8")
    weights = _linear_weights() + V * H
    if model.lm_head.sbd_kernel:  # sbd's product: one float16 scale per 32 inputs of every output row
        scales = weights // 32
    else:  # torch's kernel: one bfloat16 scale per output row of every layer
        scales = 2 * (H + H // 2 * 2 + H + 2 * I + H) + V
    want = float_bytes - 4 * weights + weights + 2 * scales
    assert weight_bytes(model) == want
    int4 = _model(False)
    quantized.quantize(int4, "int4")
    assert weight_bytes(int4) < weight_bytes(model) < float_bytes / 3


def test_the_floor_adds_the_cache_read_and_divides_by_the_bandwidth():
    model = _model(False)
    assert kv_bytes_per_position(model) == 2 * 2 * 2 * 16 * 4  # k and v, 2 layers, 2 heads of 16, float32
    floor = Floor(weight_bytes=1000, kv_bytes_per_position=10, bandwidth=1e4)
    assert floor.seconds(batch=2, cached=30, width=5) == pytest.approx((1000 + 2 * 35 * 10) / 1e4)
    assert floor_of(model, bandwidth=1e9).weight_bytes == weight_bytes(model)
    assert 1e8 < read_bandwidth("cpu", mib=64, repeats=2) < 1e13


def test_forward_cost_reports_the_floor_of_the_weights_as_loaded(tmp_path):
    from sbd.cli.main import main

    tiny.create(tmp_path / "m", vocab_size=320, hidden=64, layers=1, heads=4, kv_heads=2, context=128)
    got = {}
    for weights in ("float", "int8"):
        out = tmp_path / weights
        assert main(["forward-cost", "--model", str(tmp_path / "m"), "--weights", weights, "--widths", "1,4",
                     "--cached", "16", "--repeats", "1", "--out", str(out), "--no-progress"]) == 0
        data = json.loads((out / "forward_cost.json").read_text())
        got[weights] = data["floor"]["weight_bytes"]
        assert set(data["floor"]["ms"]) == {"1,16,1", "1,16,4"}
        text = (out / "forward_cost.md").read_text()
        assert "| | | floor ms |" in text and "×floor" in text
    assert got["int8"] < got["float"] / 3


def test_a_random_model_of_a_named_shape_takes_weights_too(tmp_path):
    """`--shape NAME --weights int4` times the quantized forward (it once timed the float one, silently)."""
    from sbd.cli.main import main

    got = {}
    for weights in ("float", "int4"):
        out = tmp_path / weights
        assert main(["forward-cost", "--shape", "tiny-gqa", "--weights", weights, "--widths", "1,2", "--cached", "8",
                     "--repeats", "1", "--out", str(out), "--no-progress"]) == 0
        data = json.loads((out / "forward_cost.json").read_text())
        got[weights] = data["floor"]["weight_bytes"], data["meta"]["weights"]
    assert got["float"][1] == "as loaded" and got["int4"][1] == "int4"
    assert got["int4"][0] < got["float"][0] / 2
