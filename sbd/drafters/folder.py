"""A drafter's tensor file (safetensors, beside its config): write, read back, copy into the attached
parameters. A damaged or missing file is one `SBDError` line, never a traceback."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import SBDError


def save(folder, config, tensors: dict[str, torch.Tensor], weights_name: str, dtype: torch.dtype) -> Path:
    """Write `tensors` (as `dtype`, on the CPU) to `folder/weights_name`, then `config`'s JSON file."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stored = {k: v.detach().to(dtype).cpu().contiguous() for k, v in tensors.items()}
    save_file(stored, str(folder / weights_name), metadata={"format": "pt"})
    config.write(folder)
    return folder


def read_tensors(path: Path, missing: str) -> dict[str, torch.Tensor]:
    """The tensors of a drafter's safetensors file; SBDError `missing` when it is absent, one line when it
    is damaged."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise SBDError(missing)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise SBDError(f"{path} is damaged or unreadable ({e})") from None


def copy_into(pairs) -> None:
    """Copy each saved tensor into its parameter, `pairs` of (parameter, saved): the same parameter objects
    stay, so an optimizer that holds them keeps working (how a training run resumes)."""
    with torch.no_grad():
        for param, saved in pairs:
            param.copy_(saved)
