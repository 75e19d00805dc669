"""The decoder layers from C++ (`sbd.decoding.native_layers`) give the Python layers' logits bit for bit: every
forward of a decoding (prefill, one-token steps, verifying forwards with the drafting adapter's gate, batched
rows at different lengths, joint and separate products, biases), int8 and int4; the forward-cost timing's
cache too; and where the extension cannot be built, the Python layers run after one line saying so."""


import pytest
import torch

import sbd
from conftest import DEVICE, _model, attach_random_adapter, blocks, random_prompts
from sbd.decoding import native_layers
from sbd.models import extension
from sbd.drafters.adapter import adapter_of
from sbd.decoding.attention import uniform_plan
from sbd.decoding.forward import ModelForward
from sbd.models import quantized
from sbd.models.narrow_linear import use_narrow_linear
from sbd.models.slab import slab_cache

# sbd-verify's own drafts (lengths per row: blocks at different columns) and whole blocks, plain SBD
METHODS = (("ntp", {}), ("sbd-verify", {}), ("sbd-verify", {"draft": "block"}), ("sbd", {}))
SAME_LENGTHS = random_prompts(2, 300, lengths=(7,), seed=27)  # rows whose blocks start at one column
pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="the native layers run on a CPU only")


@pytest.fixture(scope="module")
def built(ext):
    return ext


@pytest.fixture
def counted(monkeypatch):
    """How many forwards the native layers ran, and how many they handed back to the Python layers."""
    seen = {"native": 0, "python": 0, "gates": set()}  # gates: the gate forms the native layers ran
    call = native_layers.NativeLayers.__call__

    def counting(self, h, cos, sin, cache, layout, gate_mode, *args):
        out = call(self, h, cos, sin, cache, layout, gate_mode, *args)
        seen["python" if out is None else "native"] += 1
        if out is not None:
            seen["gates"].add(gate_mode)
        return out

    monkeypatch.setattr(native_layers.NativeLayers, "__call__", counting)
    return seen


def _records(model, prompts, native: bool, monkeypatch, own_update: bool = False, **kw):
    """(tokens, [(input ids, logits) of every forward]) of one generate call, native layers on or off (the
    adapter's update as the Python layers compute it unless `own_update`)."""
    monkeypatch.setattr(extension, "wanted", lambda: native)
    monkeypatch.setattr(native_layers, "OWN_UPDATE", own_update)
    seen = []
    out = sbd.generate(model, None, prompts, seed=0, eos_token_ids=[],
                       observer=lambda r: seen.append((r.input_ids.clone(), r.logits.clone())), **kw)
    return out.token_ids, seen


def _same_forwards(model, prompts, monkeypatch, **kw):
    want_tokens, want = _records(model, prompts, False, monkeypatch, **kw)
    got_tokens, got = _records(model, prompts, True, monkeypatch, **kw)
    assert got_tokens == want_tokens
    assert len(got) == len(want) > 1
    for (ids_g, lg), (ids_w, lw) in zip(got, want):
        assert torch.equal(ids_g, ids_w)
        assert torch.equal(lg, lw), (lg - lw).abs().max()


def _randomized(model, seed: int):
    """Random biases and norm weights: transformers starts biases at zero and norm weights at one, where
    adding a bias or the order of a norm's products would go unchecked."""
    seeded = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=seeded, device="cpu").to(m.bias.device))
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.copy_((1 + 0.5 * torch.randn(m.weight.shape, generator=seeded, device="cpu")).to(m.weight.device))
    return model


def _quantized(arch: str, fmt: str, seed: int, sbd: bool = True, **shape):
    """A quantized model with random biases, norm weights and drafting adapter; sbd: on sbd's own products, else
    torch's kernels."""
    model = _randomized(_model.__wrapped__(arch, seed=seed, **shape), seed)
    attach_random_adapter(model, seed=seed)  # as `sbd.load` does: the adapter first, then the base quantized
    if sbd:
        quantized.quantize(model, fmt)
    else:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(quantized, "sbd_products", lambda: False)
            quantized.quantize(model, fmt)
    assert all(m.sbd_kernel == sbd for m in model.modules() if isinstance(m, quantized.QuantizedLinear))
    return model


@pytest.mark.parametrize("sbd", [True, False], ids=["sbd's products", "torch's kernels"])
@pytest.mark.parametrize("joint", [False, True], ids=["own products", "joint products"])
@pytest.mark.parametrize("fmt", quantized.FORMATS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_native_layers_give_the_python_layers_logits_bit_for_bit(built, counted, monkeypatch, arch, fmt, joint, sbd):
    """qwen2 carries random biases; "joint products": head size 64, where torch's int4 q, k, v (and gate, up)
    share one kernel call; "own products": head size 16, where torch's int4 layers keep a call each (sbd's
    products join layers of any size)."""
    shape = {"hidden": 128, "heads": 2, "kv_heads": 1} if joint else {}
    model = _quantized(arch, fmt, 11, sbd, **shape)
    a = model.model.layers[0].self_attn
    assert (quantized.joint_product((a.q_proj, a.k_proj, a.v_proj)) is not None) == (joint or fmt == "int8" or sbd)
    for method, extra in METHODS:
        for prompts in (random_prompts(3, 300, seed=12), random_prompts(1, 300, seed=13), SAME_LENGTHS):
            _same_forwards(model, prompts, monkeypatch, method=method, max_new_tokens=12, **blocks(method, 4), **extra)
    assert counted["native"] > 20  # the extension ran (the first forward fills the cache in Python)
    assert counted["gates"] == {0, 1, 2}  # no block, one row's, every row's from one column (one per row: below)


@pytest.mark.parametrize("narrow", [False, True], ids=["torch's layers", "narrow layers"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_native_layers_give_float_layers_logits_bit_for_bit(built, counted, monkeypatch, arch, narrow):
    """float32 layers as loaded: torch's own, or sbd's narrow ones (W·xᵀ for few positions; one-token
    forwards as two columns where the weights would stream from memory, forced on here)."""
    model = _randomized(_model.__wrapped__(arch, seed=22), 23)
    attach_random_adapter(model, seed=24)
    if narrow:
        use_narrow_linear(model, True, widest=16, single=True)
    for method, extra in METHODS:
        for prompts in (random_prompts(3, 300, seed=25), random_prompts(1, 300, seed=26), SAME_LENGTHS):
            _same_forwards(model, prompts, monkeypatch, method=method, max_new_tokens=12, **blocks(method, 4), **extra)
    assert counted["native"] > 20
    assert counted["gates"] == {0, 1, 2}


def test_sbd_verify_keeps_ntp_tokens_through_the_native_layers(built, counted):
    model = _quantized("llama", "int4", 14, hidden=128, heads=2, kv_heads=1)
    for prompts in (random_prompts(4, 300, seed=15), random_prompts(1, 300, seed=16)):
        ntp = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=16, eos_token_ids=[]).token_ids
        verify = sbd.generate(model, None, prompts, method="sbd-verify", draft="block", block_size=4,
                              max_new_tokens=16, eos_token_ids=[])
        assert verify.token_ids == ntp
    assert counted["native"] > 10


@pytest.mark.parametrize("fmt", ["float32", "int4"])
def test_one_length_cache_and_every_gate_form_run_natively_with_the_same_logits(built, counted, monkeypatch, fmt):
    """The one-length cache `sbd forward-cost` times with, and the adapter's gate in each form: the same cache
    writes and logits as the Python layers. A block per row (a tensor of starts) comes from rows that draft
    different lengths; here it is set directly."""
    model = _quantized("qwen2", fmt, 17, hidden=128, heads=2, kv_heads=1) if fmt != "float32" else \
        _model.__wrapped__("qwen2", seed=17)
    if fmt == "float32":
        attach_random_adapter(model, seed=17)
    adapter = adapter_of(model)
    steps = ((9, 9, None), (1, 1, None), (4, 0, 0), (3, 1, 1), (4, 1, torch.tensor([1, 4], device=DEVICE)),
             (3, 3, torch.tensor([3, 1], device=DEVICE)))
    results = []
    monkeypatch.setattr(native_layers, "OWN_UPDATE", False)
    for native in (False, True):
        monkeypatch.setattr(extension, "wanted", lambda: native)
        lean = ModelForward(model).lean
        cache = slab_cache(model, 40)
        g = torch.Generator().manual_seed(18)
        logits = []
        with torch.inference_mode():
            for width, commit, start in steps:
                ids = torch.randint(3, 300, (2, width), generator=g, device="cpu").to(DEVICE)
                length = cache.layers[0].length
                pos = (length + torch.arange(width, device=DEVICE))[None].expand(2, -1)
                layout = uniform_plan(length, commit, width, False, False, DEVICE)
                adapter.start = start
                try:
                    logits.append(lean(ids, pos, cache, layout, width).logits.clone())
                finally:
                    adapter.start = None
        results.append((logits, [c._k[:, :, : c.length].clone() for c in cache.layers], cache.layers[0].length))
    (want, keys_w, n_w), (got, keys_g, n_g) = results
    assert n_g == n_w == sum(w for w, _, _ in steps)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(keys_g, keys_w))
    assert counted["native"] == len(steps) - 1 and counted["gates"] == {0, 2, 3}


@pytest.mark.parametrize("fmt", ["float32", "int4"])
def test_the_adapters_update_on_sbds_loop_changes_no_committed_token(built, counted, monkeypatch, fmt):
    """With the update on `low_rank_add` (the default): one-token forwards keep the Python layers' logits bit for
    bit, block forwards come within float32 rounding of them, and sbd-verify writes the same tokens, NTP's."""
    if fmt == "float32":
        model = _randomized(_model.__wrapped__("llama", seed=31), 31)
        attach_random_adapter(model, seed=31)
    else:
        model = _quantized("llama", fmt, 31)
    for prompts in (random_prompts(3, 300, seed=32), random_prompts(1, 300, seed=33), SAME_LENGTHS):
        ntp = None  # NTP's tokens: the first method's
        for method, extra in (("ntp", {}), ("sbd-verify", {}), ("sbd-verify", {"draft": "block"})):
            want_tokens, want = _records(model, prompts, False, monkeypatch, method=method, max_new_tokens=12,
                                         **blocks(method, 4), **extra)
            got_tokens, got = _records(model, prompts, True, monkeypatch, own_update=True, method=method,
                                       max_new_tokens=12, **blocks(method, 4), **extra)
            ntp = want_tokens if ntp is None else ntp
            assert got_tokens == want_tokens == ntp
            assert len(got) == len(want) > 1
            for (ids_g, lg), (ids_w, lw) in zip(got, want):
                assert torch.equal(ids_g, ids_w)
                if method == "ntp":
                    assert torch.equal(lg, lw)
                else:
                    assert (lg - lw).abs().max() <= 1e-5 * lw.abs().max()
    assert counted["gates"] >= {1, 2}


def test_without_a_compiler_the_python_layers_run_after_one_line(counted, monkeypatch, tmp_path, capsys):
    model = _quantized("llama", "int8", 19)
    prompts = random_prompts(2, 300, seed=20)
    want = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=8, eos_token_ids=[]).token_ids
    counted.update(native=0, python=0)
    monkeypatch.setattr(extension, "_MODULE", {})
    monkeypatch.setattr(extension, "_WARNED", set())
    monkeypatch.setenv("SBD_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    extension.prepare("cuda")  # nothing to build for a GPU: not even a try
    assert extension._MODULE == {}
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        extension.build()
    for _ in range(2):
        got = sbd.generate(model, None, prompts, method="ntp", max_new_tokens=8, eos_token_ids=[]).token_ids
        assert got == want
    err = capsys.readouterr().err
    assert err.count("could not be built here (no C++ compiler ('no-such-compiler-here') on PATH)") == 1
    assert counted["native"] == 0 and counted["python"] > 0
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.part"))


def test_other_layers_and_the_switch_keep_the_python_layers(monkeypatch):
    model = _model.__wrapped__("llama", seed=21)
    assert ModelForward(model).lean.native is not None
    monkeypatch.setenv("SBD_NATIVE", "0")
    assert ModelForward(model).lean.native is None
    monkeypatch.delenv("SBD_NATIVE")
    layer = model.model.layers[1].mlp.down_proj
    layer.forward = lambda x: torch.nn.functional.linear(x, layer.weight)  # a forward of its own
    assert "linear layers" in native_layers.why_not(model)
    assert ModelForward(model).lean.native is None


def test_a_first_use_compiles_in_the_background_while_the_python_layers_run(built, monkeypatch, tmp_path, capsys):
    """A process that finds no compiled extension starts the compiler in a thread (at the lowest priority)
    and its forwards run the Python layers meanwhile; the file appears whole (written, then renamed) and the
    next forward takes it."""
    monkeypatch.setattr(extension, "_MODULE", {})
    monkeypatch.setattr(extension, "_BUILDING", [])
    monkeypatch.setenv("SBD_CACHE", str(tmp_path))
    loaded = []
    monkeypatch.setattr(extension, "_load", lambda name, path: loaded.append(path) or "the module")
    assert extension.ready() is None  # the compiler runs; the caller goes on with the Python layers
    assert extension.ready() is None and len(extension._BUILDING) == 1  # one build, not two
    extension._BUILDING[0].join(timeout=900)
    assert extension.ready() == "the module"
    assert [p.name for p in tmp_path.rglob("*.so")] == [f"{extension._name()}.so"]
    assert not list(tmp_path.rglob("*.part")) and loaded == [tmp_path / "native" / f"{extension._name()}.so"]
    assert capsys.readouterr().err.count("compiling its native decoder layers in the background") == 1
