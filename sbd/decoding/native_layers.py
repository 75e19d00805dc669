"""The decoder layers of sbd's Llama forward run from C++: the same operations, the same bits, less time.

Why: a one-token forward of SmolLM2-135M with int4 weights spends about as long around its kernels as in
them: ~2,000 small operations (norms, casts, the rotation, views, cache writes), each ~1.4 µs when Python
calls it and ~0.7 µs from C++, and the Python between them. `native/decoder_layers.cpp` makes the very
calls `LlamaForward` makes, in the same order, so the logits are bit for bit the Python layers'
(tests/test_native_layers.py); the embedding, the rotary tables, the last norm and the output layer stay in
Python (the drafting adapter's and the sampler head's hooks on them run).

Where it runs: a CPU; linear layers that are torch's own, sbd's narrow ones (`sbd.models.narrow_linear`) or
quantized (`weights="int8"/"int4"`); SiLU activations; the engine's slot cache or the one-length cache of
`sbd forward-cost`, with any attention plan a CPU takes; the drafting adapter's gate in every form a decoding
forward takes. Anything else (other layers, a GPU, gradients) runs the Python layers.

The extension is compiled once per machine (one call of the C++ compiler, `c++` or $CXX, against torch's
headers and libraries: ~30 s on 2 cores) into sbd's cache folder and loaded from there afterwards. The first
process that wants it compiles it in the background while its forwards run the Python layers, so no call
waits for the compiler. Where it cannot be built, sbd says so once and runs the Python layers: the same
tokens, slower. `SBD_NATIVE=0` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import torch
from torch import nn

from ..models.names import cache_dir
from ..models.narrow_linear import NARROWEST, NarrowLinear
from ..models.quantized import QuantizedLinear

SOURCE = Path(__file__).resolve().parent / "native" / "decoder_layers.cpp"
KINDS = {"int8": 1, "int4": 2}
_MODULE: dict[str, object] = {}  # "module" or "error", once per process
_LOCK = threading.Lock()
_BUILDING: list[threading.Thread] = []  # the background build, once started


def cache_folder() -> Path:
    """Where the compiled extension is kept: sbd's cache folder ($SBD_CACHE, default ~/.cache/sbd)."""
    return cache_dir() / "native"


@functools.lru_cache(maxsize=1)
def _name() -> str:
    """The extension's file name: the source and the torch it was built against (a change builds anew)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + sys.version.encode()).hexdigest()
    return f"sbd_decoder_layers_{digest[:12]}"


def _compile(name: str, target: Path, background: bool = False) -> None:
    """Compile and link the extension into `target` with torch's headers and libraries (one compiler call);
    written under a temporary name and renamed, so a build cut short leaves nothing half-written and two
    processes building at once both end with a whole file."""
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler ({cxx!r}) on PATH")
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libs = cpp_extension.library_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f"{target.stem}.{os.getpid()}.{threading.get_ident()}.part")
    cmd = [cxx, "-O2", "-std=c++17", "-fPIC", "-shared", f"-DTORCH_EXTENSION_NAME={name}",
           "-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           *(f"-isystem{p}" for p in includes), str(SOURCE), *(f"-L{p}" for p in libs),
           "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python", "-o", str(part)]
    try:
        if background and shutil.which("nice"):  # the lowest priority: the forwards it runs beside keep the cores
            cmd = ["nice", "-n", "19", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            error = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[-200:])
            raise RuntimeError(f"{cxx} failed: {error.strip()[:200]}")
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(background: bool = False):
    """The compiled extension, compiled here on first use (~30 s) and kept on disk for every later process;
    raises RuntimeError with one line saying why it cannot be built or loaded here. background: the
    compiler runs at the lowest priority (beside decoding)."""
    with _LOCK:
        if "module" in _MODULE:
            return _MODULE["module"]
        if "error" in _MODULE:
            raise RuntimeError(_MODULE["error"])
        name = _name()
        path = cache_folder() / f"{name}.so"
        try:
            if not path.exists():
                _compile(name, path, background)
            _MODULE["module"] = _load(name, path)
        except Exception as err:  # noqa: BLE001 (any failure to build or load means: the Python layers)
            first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
            _MODULE["error"] = f"sbd's native decoder layers could not be built here ({first[:200]})"
            raise RuntimeError(_MODULE["error"]) from None
        return _MODULE["module"]


def ready():
    """The extension when it is loaded already, or on disk (loaded now, a fraction of a second); else None,
    and a build starts in the background (once per process) so that a first forward never waits for the
    compiler. Raises RuntimeError where it cannot be built."""
    if "module" in _MODULE or "error" in _MODULE:
        return build()
    if _BUILDING:  # started and not finished yet
        return None
    if (cache_folder() / f"{_name()}.so").exists():
        return build()
    with _LOCK:
        if _BUILDING:
            return None
        _BUILDING.append(threading.Thread(target=_build_quietly, name="sbd-native-build", daemon=True))
    print("sbd: compiling its native decoder layers in the background (once per machine, about 30 s on 2 cores); "
          "until then the Python layers run, with the same tokens", file=sys.stderr)
    _BUILDING[0].start()
    return None


def prepare(device="cpu") -> None:
    """Build (or load) the extension now, for commands that time what they run (`sbd demo`, `sbd bench`,
    `sbd forward-cost`) or serve, on `device`: none of their calls should share the cores with the compiler.
    Nothing for a GPU (the layers run on a CPU only). Where it cannot be built, one line says so and the
    Python layers run."""
    if not wanted() or str(device).split(":", 1)[0] != "cpu":  # a bad device string is the loader's to refuse
        return
    try:
        if "module" not in _MODULE and not (cache_folder() / f"{_name()}.so").exists():
            print("sbd: compiling its native decoder layers (once per machine, about 30 s on 2 cores)", file=sys.stderr)
        build()
    except RuntimeError as err:
        _warn(str(err))


def _build_quietly() -> None:
    try:
        build(background=True)
    except RuntimeError:
        pass  # kept in _MODULE["error"]: the next forward that asks says it


def wanted() -> bool:
    """Whether to use the native layers where they apply (SBD_NATIVE=0 turns them off)."""
    return os.environ.get("SBD_NATIVE", "1") != "0"


def takes(model) -> bool:
    """Whether the native layers would run a Llama-family `model` (read from the model alone, nothing built):
    layers the extension takes, on a CPU, not switched off nor known to be unbuildable here."""
    return wanted() and "error" not in _MODULE and why_not(model) is None


def why_not(model) -> str | None:
    """None when the native layers can run the decoder layers of `model` (a Llama-family model that
    `LlamaForward` runs), else why not (a phrase)."""
    if model.get_input_embeddings().weight.device.type != "cpu":
        return "the model is not on a CPU"
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        lins = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        if not all(type(lin) in (QuantizedLinear, nn.Linear, NarrowLinear) and "forward" not in lin.__dict__
                   for lin in lins):
            return "its linear layers are not torch's, sbd's narrow or quantized ones"
        if not _silu(m.act_fn):
            return "its activation is not SiLU"
    return None


def _silu(act) -> bool:
    """torch's SiLU or transformers' (`SiLUActivation`: F.silu), with no forward of its own swapped in."""
    kind = type(act)
    ours = kind is nn.SiLU or (kind.__name__ == "SiLUActivation" and kind.__module__ == "transformers.activations")
    return ours and "forward" not in act.__dict__


def _linear(entry, lin) -> tuple:
    """(kind, weight, scales, group, bias, Aᵀ, Bᵀ, narrow lo, narrow hi) of one layer, as the extension takes
    it: quantized layers by format; float ones by the forward `LlamaForward` bound (`entry`), a narrow
    layer's with the positions it takes its narrow form at."""
    _, quantized, _, key, update = entry
    a_t, b_t = update if update is not None else (None, None)
    if quantized:
        scales = lin.scales if lin.fmt == "int8" else lin.scale_zero
        return KINDS[lin.fmt], lin.qweight, scales, lin.group, lin.bias, a_t, b_t, 0, 0
    if entry[0].__func__ is NarrowLinear.forward:
        lo = 1 if lin.narrow_single else NARROWEST
        return 3, lin.weight, None, 0, lin.bias, a_t, b_t, lo, lin.narrow_widest
    return 0, lin.weight, None, 0, lin.bias, a_t, b_t, 0, 0


def _joint(product, sizes) -> tuple | None:
    if product is None:
        return None
    return KINDS[product.fmt], product.weight, product.scales, product.group, list(sizes)


class NativeLayers:
    """`LlamaForward`'s decoder layers in the extension's `DecoderLayers`, bound at the first forward that
    finds the extension ready (`ready`: until then, and where it cannot be built, the Python layers run)."""

    def __init__(self, lean):
        self.layers, self.broken = None, False
        self.args = []  # per layer, what `DecoderLayers.add_layer` takes: the Python layers' own tensors
        for layer, entry in zip(lean.inner.layers, lean.layers):
            (n1, e1), (n2, e2), hd, scaling, _, linears, (qkv, gu), qkv_sizes, gu_sizes = entry
            a, m = layer.self_attn, layer.mlp
            mods = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
            self.args.append((n1, e1, n2, e2, hd, scaling, [_linear(e, mod) for e, mod in zip(linears, mods)],
                              _joint(qkv, qkv_sizes), _joint(gu, gu_sizes)))

    def _bound(self):
        """The extension's layers, or None while it is being built or where it cannot be (said once)."""
        if self.layers is None and not self.broken:
            try:
                module = ready()
            except RuntimeError as err:
                self.broken = True
                _warn(str(err))
                return None
            if module is None:
                return None
            self.layers = module.DecoderLayers()
            for args in self.args:
                self.layers.add_layer(*args)
        return self.layers

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, layout, gate_mode: int,
                 gate_start: int, gate_per_row: torch.Tensor | None, adapter_scaling: float) -> torch.Tensor | None:
        """The hidden states after the decoder layers, or None where this forward's cache or plan is not one
        the extension runs (the caller then runs the Python layers)."""
        layers = self._bound()
        caches = cache.layers
        first = caches[0]
        if layers is None or not getattr(first, "is_initialized", False):
            return None
        plan = layout.plan
        if plan == "rows" and layout.fold != 1 or plan == "split" and layout.mask is None:
            return None
        rows = [int(v) for r in layout.rows for v in r] if plan == "exact" else []
        if hasattr(first, "write_from"):  # the engine's slot cache (`SlotLayer.update`)
            lo, hi, visible, wf, write_at = first.lo, first.hi, first.visible, first.write_from, first.write_at
        elif hasattr(first, "length") and hasattr(first, "capacity"):  # one length for all rows (`SlabLayer.update`)
            lo, hi, wf, write_at = 0, h.shape[0], first.length, None
            visible = wf + h.shape[1]
            if visible > first.capacity:
                raise RuntimeError(f"KV cache overflow: {visible} > capacity {first.capacity}")
        else:
            return None
        out = layers.forward(h, cos, sin, [c._k for c in caches], [c._v for c in caches], lo, hi, visible,
                             -1 if wf is None else wf, None if wf is not None else write_at, plan, layout.length,
                             layout.width, layout.causal_blocks, layout.mask, rows, gate_mode, gate_start,
                             gate_per_row, adapter_scaling)
        if not hasattr(first, "write_from"):
            for c in caches:
                c.length = visible
        return out


_WARNED: set[str] = set()


def _warn(error: str) -> None:
    if error not in _WARNED:
        _WARNED.add(error)
        print(f"sbd: {error}; running the Python layers (the same tokens, slower). SBD_NATIVE=0 silences this",
              file=sys.stderr)


def bind(lean) -> NativeLayers | None:
    """`lean`'s layers for the extension where they can run, else None (the Python layers)."""
    if not wanted() or why_not(lean.model) is not None:
        return None
    return NativeLayers(lean)
