"""Before `sbd train --adapter lora` builds a fresh adapter: the base model's name as the adapter records
it, and whether the adapter can be trained at all (its rank against the layer widths, its memory
against what the machine has)."""

from __future__ import annotations

from pathlib import Path

from ..errors import SBDError

BYTES_PER_PARAMETER = 16  # fp32: the weight, its gradient and Adam's two moments, 4 bytes each


def base_name(model: str) -> str:
    """The base as the user named it: a shipped name (demo, smollm2) stays a name, a real folder becomes
    an absolute path, so that `sbd generate --model OUT` finds it from any directory."""
    from ..models.names import DEMO_NAMES, PACKAGED_MODELS

    path = Path(model)
    if str(model) in (*DEMO_NAMES, *PACKAGED_MODELS) and not path.exists():
        return str(model)
    return str(path.resolve()) if path.is_dir() else str(model)


def available_bytes(device) -> int | None:
    """Free memory where the adapter will live: the GPU's free memory, else the machine's available
    memory (psutil if installed, else /proc/meminfo's MemAvailable); None when it cannot be told."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(model, rank: int, targets) -> None:
    """SBDError in one line when a rank-`rank` adapter on `targets` is meaningless (above a layer's
    smaller side) or when its training state cannot fit in the available memory."""
    from ..drafters.adapter import _targets

    layers = _targets(model, targets)
    name, smallest = min(layers.items(), key=lambda kv: min(kv[1].in_features, kv[1].out_features))
    width = min(smallest.in_features, smallest.out_features)
    if rank > width:
        raise SBDError(f"--rank {rank} is larger than the adapted layers allow: {name} is {smallest.in_features} x "
                       f"{smallest.out_features}, so a rank above {width} adds nothing; use --rank {width} or less")
    per_rank = sum(lin.in_features + lin.out_features for lin in layers.values())
    hidden = model.get_input_embeddings().embedding_dim
    need = (rank * per_rank + hidden) * BYTES_PER_PARAMETER
    free = available_bytes(model.get_input_embeddings().weight.device)
    if free is not None and need > free:
        fits = max(0, (free // BYTES_PER_PARAMETER - hidden) // per_rank)
        raise SBDError(f"--rank {rank} needs about {_size(need)} for the adapter (weights, gradients and "
                       f"Adam state in fp32, activations not counted), more than the {_size(free)} "
                       f"available; use --rank {fits} or less" + ("" if fits else " (none fits: free memory first)"))



def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
