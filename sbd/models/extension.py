"""sbd's compiled extension (`sbd/native/`): the decoder layers from C++ (`sbd.decoding.native_layers`) and sbd's
own int8 product (`sbd.models.quantized`), built on this machine and kept.

The extension is compiled once per machine (one call of the C++ compiler, `c++` or $CXX, against torch's
headers and libraries: ~30 s on 2 cores) into sbd's cache folder and loaded from there afterwards. Where it
cannot be built, sbd says so once and runs torch's operations instead. `SBD_NATIVE=0` turns it off.
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

from .names import cache_dir

SOURCES = Path(__file__).resolve().parents[1] / "native"
MAIN = SOURCES / "decoder_layers.cpp"  # it includes the rest
_MODULE: dict[str, object] = {}  # "module" or "error", once per process
_LOCK = threading.Lock()
_BUILDING: list[threading.Thread] = []  # the background build, once started


def cache_folder() -> Path:
    """Where the compiled extension is kept: sbd's cache folder ($SBD_CACHE, default ~/.cache/sbd)."""
    return cache_dir() / "native"


@functools.lru_cache(maxsize=1)
def _name() -> str:
    """The extension's file name: its sources and the torch it was built against (a change builds anew)."""
    digest = hashlib.sha256(torch.__version__.encode() + sys.version.encode())
    for source in sorted(SOURCES.iterdir()):
        if source.suffix in (".cpp", ".h"):
            digest.update(source.name.encode() + source.read_bytes())
    return f"sbd_decoder_layers_{digest.hexdigest()[:12]}"


def _compile(name: str, target: Path, background: bool = False) -> None:
    """Compile and link the extension into `target` with torch's headers and libraries (one compiler call);
    written under a temporary name and renamed, so a build cut short leaves nothing half-written and two
    processes building at once both end with a whole file. OpenMP: the products split their rows over torch's
    threads (the OpenMP runtime torch loaded already)."""
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler ({cxx!r}) on PATH")
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libs = cpp_extension.library_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f"{target.stem}.{os.getpid()}.{threading.get_ident()}.part")
    cmd = [cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-fPIC", "-shared", "-fopenmp", f"-DTORCH_EXTENSION_NAME={name}",
           "-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           *(f"-isystem{p}" for p in includes), str(MAIN), *(f"-L{p}" for p in libs),
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
        except Exception as err:  # noqa: BLE001 (any failure to build or load means: torch's operations)
            first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
            _MODULE["error"] = f"sbd's native decoder layers could not be built here ({first[:200]})"
            raise RuntimeError(_MODULE["error"]) from None
        return _MODULE["module"]


def loaded():
    """The extension when this process has loaded it already, else None (nothing is built or loaded)."""
    return _MODULE.get("module")


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


def prepare(device="cpu"):
    """Build (or load) the extension now and return it (None where it cannot be: one line says so), for
    commands that time what they run (`sbd demo`, `sbd bench`, `sbd forward-cost`) or serve, and for
    quantized weights (their int8 product is chosen once, when they are made), on `device`. Nothing for a
    GPU (the extension runs on a CPU only)."""
    if not wanted() or str(device).split(":", 1)[0] != "cpu":  # a bad device string is the loader's to refuse
        return None
    try:
        if "module" not in _MODULE and not (cache_folder() / f"{_name()}.so").exists():
            print("sbd: compiling its native decoder layers (once per machine, about 30 s on 2 cores)", file=sys.stderr)
        return build()
    except RuntimeError as err:
        warn(str(err))
        return None


def _build_quietly() -> None:
    try:
        build(background=True)
    except RuntimeError:
        pass  # kept in _MODULE["error"]: the next forward that asks says it


def wanted() -> bool:
    """Whether to use the extension where it applies (SBD_NATIVE=0 turns it off)."""
    return os.environ.get("SBD_NATIVE", "1") != "0"


def broken() -> bool:
    """Whether this process tried to build or load the extension and could not."""
    return "error" in _MODULE


_WARNED: set[str] = set()


def warn(error: str) -> None:
    """Say once per process why the extension is not used (`error`: one line)."""
    if error not in _WARNED:
        _WARNED.add(error)
        print(f"sbd: {error}; running torch's operations instead (slower). SBD_NATIVE=0 silences this",
              file=sys.stderr)
