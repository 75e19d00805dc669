"""Quantized weights (`sbd.load(..., weights="int8"|"int4")`, `sbd.models.quantized`): the layers compute
what their weights say, each row alone as in any batch, and sbd-verify gives exactly the tokens of sbd's NTP
decoding of the same quantized weights, alone and batched, on a model whose logits nearly tie (no decisive
output layer here: with float32 matrix products such a model's wide and one-token forwards pick different
tokens now and then; the exact attention plan makes them bitwise equal). The layer and exactness tests run on
the tiny models' device (SBD_TEST_DEVICE): on CUDA they say whether its kernels keep the same promise."""

import pytest
import torch
from torch import nn

import sbd
from sbd.errors import SBDError
from sbd.models import quantized, tiny

from conftest import DEVICE

FORMATS = quantized.FORMATS
MODEL_FORMATS = ("int4",) if DEVICE.type == "cuda" else FORMATS  # CUDA refuses int8 (its kernel is slow)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_quantized_layer_computes_its_weights_and_each_row_alone(fmt):
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(128, 48, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 128, generator=g) * 0.05)
        lin.bias.copy_(torch.randn(48, generator=g))
    lin.to(DEVICE)
    quantized.check_kernels(DEVICE)
    q = quantized.QuantizedLinear.from_linear(lin, fmt)
    x = torch.randn(2, 17, 128, generator=g).to(DEVICE)
    want = lin(x)
    got = q(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got - want).abs().max() < 0.05 * want.abs().max()  # bf16 activations and 8/4-bit weights
    for i in (0, 5, 16):  # row-invariant: a row alone is bit for bit the same row among 34
        assert torch.equal(q(x[1:2, i : i + 1]), got[1:2, i : i + 1])


def test_int4_takes_int8_where_its_kernel_cannot_pack_and_the_output_layer_is_int8():
    cfg = tiny.tiny_config("llama", vocab_size=300, hidden=64, layers=1, heads=2, kv_heads=1)  # k/v: 32 rows
    model = tiny.random_model(cfg, seed=1)
    done = quantized.quantize(model, "int4")
    assert done["lm_head"] == "int8" and done["model.layers.0.self_attn.q_proj"] == "int4"
    assert quantized.weights_format(model) == "int4" and quantized.row_invariant(model)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())


def _nearly_tied_model(seed: int = 3):
    """SmolLM2's attention shapes (head size 64, 9 query and 3 key/value heads) at two layers, an output
    layer as initialised: logits within a few hundredths of each other, where rounding decides."""
    cfg = tiny.tiny_config("llama", vocab_size=512, hidden=576, layers=2, heads=9, kv_heads=3, context=1024)
    model = tiny.random_model(cfg, seed=seed)
    model.config.sbd_mask_token_id = 511
    return model.to(DEVICE)


def _looping_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    """Prompts that repeat a random phrase, so that prompt lookup drafts and the drafts are accepted."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        phrase = torch.randint(0, vocab - 1, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g).tolist()
        out.append((phrase * 40)[: int(torch.randint(150, 220, (1,), generator=g))])
    return out


def _committed_logits(model, prompt, **kw) -> tuple[list[int], dict]:
    """(tokens, {cache position: (next-token logits computed there, whether in a forward wider than one
    token)}) for every committed position of one prompt's decoding (observer records; rows right-aligned)."""
    seen = {}

    def observe(r):
        keep = r.logits.shape[1]
        for t in range(r.commits[0]):
            if keep - r.reals[0] + t >= 0:
                seen[r.lengths[0] + t] = (r.logits[0, keep - r.reals[0] + t].clone(), r.reals[0] > 1)

    return sbd.generate(model, None, [prompt], observer=observe, **kw).token_ids[0], seen


def _compare(model, prompts, **kw) -> tuple[int, int, bool]:
    """(positions compared, of them computed in wide forwards, all bitwise equal): sbd-verify's committed
    positions against NTP's one-token forwards at the same positions of the same prompts, each alone."""
    compared = wide = 0
    equal = True
    for p in prompts:
        ntp_tokens, ntp = _committed_logits(model, p, method="ntp", **kw)
        ver_tokens, ver = _committed_logits(model, p, method="sbd-verify", block_size=4, lookup=True, **kw)
        for pos, (logits, is_wide) in ver.items():
            if pos in ntp:
                compared += 1
                wide += is_wide
                equal &= torch.equal(logits, ntp[pos][0])
    return compared, wide, equal


KW = dict(max_new_tokens=40, eos_token_ids=[])


@pytest.mark.parametrize("fmt", MODEL_FORMATS)
def test_sbd_verify_computes_ntps_logits_bit_for_bit_and_gives_its_tokens_alone_and_batched(fmt):
    model = _nearly_tied_model()
    quantized.quantize(model, fmt)
    prompts = _looping_prompts(3, 512, seed=7)
    compared, wide, equal = _compare(model, prompts, **KW)
    assert equal and wide >= 20, (compared, wide)
    assert [sbd.generate(model, None, [p], method="sbd-verify", block_size=4, lookup=True, **KW).token_ids[0]
            for p in prompts] == [sbd.generate(model, None, [p], method="ntp", **KW).token_ids[0] for p in prompts]
    ntp = sbd.generate(model, None, prompts, method="ntp", **KW)
    for draft in ("block", "adaptive"):
        batched = sbd.generate(model, None, prompts, method="sbd-verify", block_size=4, draft=draft, lookup=True, **KW)
        assert batched.token_ids == ntp.token_ids
    assert [sbd.generate(model, None, [p], method="ntp", **KW).token_ids[0] for p in prompts] == ntp.token_ids


def test_without_the_exact_plan_the_logits_differ(monkeypatch):
    """The check above can fail: with the masked attention plans a wide forward's committed positions are
    not bitwise the one-token forwards (float32 matrix products of attention depend on how many rows)."""
    import sbd.decoding.forward as forward

    monkeypatch.setattr(forward, "row_invariant", lambda model: False)
    model = _nearly_tied_model()
    quantized.quantize(model, MODEL_FORMATS[0])
    compared, wide, equal = _compare(model, _looping_prompts(3, 512, seed=7), **KW)
    assert wide >= 20
    if equal:  # kernels that happen to be row-invariant for these shapes: nothing to show on this machine
        pytest.skip("this machine's attention kernels gave the wide and one-token forwards the same bits")


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA's kernels: runs where SBD_TEST_DEVICE=cuda")
def test_cuda_refuses_int8_whose_kernel_is_slower_than_bfloat16():
    model = _nearly_tied_model()
    with pytest.raises(SBDError, match="int8.*slower than bfloat16"):
        quantized.quantize(model, "int8")
    assert quantized.weights_format(model) is None


def test_load_takes_a_quantized_format_and_refuses_others():
    model, tok = sbd.load("demo", weights="int8")
    assert quantized.weights_format(model) == "int8"
    out = sbd.generate(model, tok, ["Add up: 12 + 7 - 3 + 45\n"], max_new_tokens=24)
    assert out.token_ids == sbd.generate(model, tok, ["Add up: 12 + 7 - 3 + 45\n"], method="ntp",
                                         max_new_tokens=24).token_ids
    with pytest.raises(SBDError, match="int8, int4"):
        sbd.load("demo", weights="int3")
    with pytest.raises(SBDError, match="int8, int4"):
        sbd.load("demo", weights=8)
    plain, _ = sbd.load("demo", weights=None)  # "not quantized": the weights as stored, not the meta model
    assert plain.device.type == "cpu" and quantized.weights_format(plain) is None


@pytest.mark.parametrize("setting", [{"compile": True}, {"static_shapes": True}, {"tree": (2, 2)}])
def test_what_has_no_exact_attention_on_quantized_weights_is_refused_naming_it(setting):
    model, tok = sbd.load("demo", weights="int4")
    name = next(iter(setting))
    with pytest.raises(SBDError, match=f"{name}.*not supported on int4 weights"):
        sbd.generate(model, tok, ["Add up: 1 + 2\n"], max_new_tokens=8, **setting)


def test_the_command_line_loads_quantized_weights_and_says_so(capsys):
    from sbd.cli.main import main

    assert main(["generate", "--model", "demo", "--weights", "int4", "--max-new-tokens", "8", "Add up: 1 + 2"]) == 0
    err = capsys.readouterr().err
    assert "weights" in err and "int4" in err
    with pytest.raises(SystemExit) as stop:  # argparse: a usage line and one error line
        main(["generate", "--model", "demo", "--weights", "int3", "x"])
    assert stop.value.code == 2


def test_the_server_names_quantized_weights_and_answers_as_offline():
    from starlette.testclient import TestClient

    from sbd.serving.app import create_app
    from sbd.serving.config import ServerConfig

    model, tok = sbd.load("demo", weights="int8")
    offline = sbd.generate(model, tok, ["Add up: 12 + 7 - 3 + 45\n"], max_new_tokens=16).texts[0]
    with TestClient(create_app(model, tok, ServerConfig(model_name="demo"))) as http:
        card = http.get("/v1/models").json()["data"][0]
        assert card["weights"] == "int8"
        got = http.post("/v1/completions", json={"prompt": "Add up: 12 + 7 - 3 + 45\n", "max_tokens": 16})
        assert got.status_code == 200 and got.json()["choices"][0]["text"] == offline


def test_quantize_keeps_biases_and_the_model_close_to_its_float_self():
    cfg = tiny.tiny_config("qwen2", vocab_size=300, hidden=64, layers=1, heads=2, kv_heads=1)  # q/k/v biases
    model = tiny.random_model(cfg, seed=1).eval()
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(0), device="cpu")
    with torch.no_grad():
        want = model(ids).logits
        quantized.quantize(model, "int4")
        got = model(ids).logits
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    assert (got - want).abs().max() < 0.15 * want.abs().max()


@pytest.mark.parametrize("how", ["eager attention", "dense attention"])
def test_quantized_weights_without_the_exact_attention_are_refused_not_decoded_inexactly(how):
    """Only the exact plan makes sbd-verify's wide forwards NTP's bits on quantized weights; a model whose
    attention sbd cannot route would decode with the dense mask and could leave NTP's tokens unnoticed."""
    from sbd.decoding.engine import Engine

    model = _nearly_tied_model()
    quantized.quantize(model, MODEL_FORMATS[0])
    if how == "eager attention":
        model.config._attn_implementation = "eager"
        with pytest.raises(SBDError, match="exact attention.*'eager'"):
            sbd.generate(model, None, [[1, 2, 3]], max_new_tokens=4, eos_token_ids=[])
    else:
        with pytest.raises(SBDError, match="exact attention.*dense"):
            Engine(model, 1, 64, attention="dense")
