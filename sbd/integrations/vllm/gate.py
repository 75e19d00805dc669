"""The drafting adapter's updates inside vLLM's compiled graph, gated to this step's mask rows.

vLLM traces its model once and replays that graph (on a GPU, as CUDA graphs too) for every forward, so the
updates are forward hooks attached before the trace, and they read the step's mask rows from persistent
buffers that the model writes before each forward (`Gate.open`). The graph's shapes depend only on the
number of tokens, and a forward with masks runs the same graph as one without.

- `sbd_gate` (slots × 1): the adapter's scale alpha/r at the gated rows, 0 elsewhere. The embedding's hook
  gives those rows the adapter's mask embedding (every path).
- Path "dense" (capturable in CUDA graphs; the default off the CPU): each fused layer adds
  `gate · (x Aᵀ) Bᵀ` over every row and keeps it where the gate is non-zero (`torch.where`), so a
  committed row is bit for bit the plain model's. A plain step pays for it: two small matmuls per layer.
- Path "op" (the default on a CPU): each fused layer calls the custom op `sbd_vllm::gated_update_`, which
  reads the number of gated rows from a host buffer, returns at once when it is 0, and else adds the
  update at those rows only (float32 small matmuls: bfloat16 ones are several times slower on a CPU). A
  branch on the host cannot be captured in a CUDA graph, so this path runs on the CPU only.
Both paths compute the update with `sbd.drafters.gated.gated_update`, as the Hugging Face adapter does.
Measured on the plain steps of SmolLM2 at batch 1 on a 2-core CPU: docs/serving.md.
"""

from __future__ import annotations

import torch

from sbd.drafters.gated import gated_update

PATHS = ("dense", "op")

_LIB = torch.library.Library("sbd_vllm", "FRAGMENT")
_LIB.define("gated_update_(Tensor(a!) out, Tensor x, Tensor a_t, Tensor b_t, Tensor rows, Tensor count, "
            "float scale) -> ()")


def _gated_update_cpu(out, x, a_t, b_t, rows, count, scale):
    m = int(count)
    if m == 0:
        return
    gated_update(out, x, a_t, b_t, scale, rows=rows[:m])


def _gated_update_fake(out, x, a_t, b_t, rows, count, scale):
    return None


_LIB.impl("gated_update_", _gated_update_cpu, "CPU")
torch.library.register_fake("sbd_vllm::gated_update_", _gated_update_fake, lib=_LIB)


def _dense_update(module, args, output):
    """A fused layer's hook, path "dense": out + gate · (x Aᵀ) Bᵀ where the gate is open, out elsewhere."""
    out, rest = (output[0], output[1:]) if isinstance(output, tuple) else (output, None)
    x = args[0]
    out = gated_update(out, x, module.sbd_a_t, module.sbd_b_t, column=module.sbd_gate[: x.shape[0]])
    return out if rest is None else (out, *rest)


def _op_update(module, args, output):
    """A fused layer's hook, path "op": the custom op updates the gated rows in place (none: it returns)."""
    out = output[0] if isinstance(output, tuple) else output
    torch.ops.sbd_vllm.gated_update_(out, args[0], module.sbd_a_t, module.sbd_b_t, module.sbd_rows,
                                     module.sbd_count, module.sbd_scale)
    return None


def _mask_rows(module, args, output):
    """The embedding's hook: gated rows take the adapter's mask embedding. It also counts the forwards
    that ran eagerly (a compiled graph runs no Python, so it never counts)."""
    if not torch.compiler.is_compiling():
        module.sbd_eager_calls += 1
    gate = module.sbd_gate[: output.shape[0]]
    return torch.where(gate != 0, module.sbd_mask_embedding, output)


class Gate:
    """The persistent buffers of one model's gate and the hooks that read them (see the module docstring).
    slots: the most tokens one forward holds (vLLM's max_num_batched_tokens)."""

    def __init__(self, slots: int, dtype: torch.dtype, device: torch.device, path: str | None = None):
        device = torch.device(device)
        path = path or ("op" if device.type == "cpu" else "dense")
        if path not in PATHS:
            raise ValueError(f"sbd_gate_path must be one of {', '.join(PATHS)}, not {path!r}")
        if path == "op" and device.type != "cpu":
            raise ValueError('sbd_gate_path "op" branches on the host, which CUDA graphs cannot capture: use "dense"')
        self.path, self.scale = path, 0.0
        self.values = torch.zeros(slots, 1, dtype=dtype, device=device)
        self.rows = torch.zeros(slots, dtype=torch.long, device=device)
        self.count = torch.zeros((), dtype=torch.long)  # on the host: path "op" reads it there
        self._open: torch.Tensor | None = None
        self.handles: list = []

    @property
    def slots(self) -> int:
        return self.values.shape[0]

    def open(self, rows: torch.Tensor | None) -> None:
        """Open the gate at `rows` (this forward's gated rows; None: none) and close it where it was open."""
        if self._open is not None:
            self.values.index_fill_(0, self._open, 0.0)
            self.count.fill_(0)
        if rows is not None and rows.numel():
            self.values.index_fill_(0, rows, self.scale)
            self.rows[: rows.numel()].copy_(rows)
            self.count.fill_(rows.numel())
            self._open = rows
        else:
            self._open = None

    def _attach(self, module, hook, **buffers) -> None:
        """Buffers on `module` (module state: vLLM's graph and its compile cache take them as inputs, not
        constants); a reload replaces them in place; the hook is attached once."""
        for name, value in dict(buffers, sbd_gate=self.values, sbd_rows=self.rows, sbd_count=self.count).items():
            old = getattr(module, name, None)
            if isinstance(old, torch.Tensor) and old.shape == value.shape and old is not value:
                old.copy_(value)
            else:
                module.register_buffer(name, value, persistent=False)
        module.sbd_scale = self.scale
        if not getattr(module, "_sbd_hooked", False):
            self.handles.append(module.register_forward_hook(hook))
            module._sbd_hooked = True

    def attach_embedding(self, module, mask_embedding: torch.Tensor) -> None:
        self._attach(module, _mask_rows, sbd_mask_embedding=mask_embedding.to(self.values))
        module.sbd_eager_calls = 0

    def attach_update(self, module, a: torch.Tensor, b: torch.Tensor) -> None:
        """The update `scale · (x aᵀ) bᵀ` of one fused layer (a: rank × in, b: out × rank)."""
        dtype = self.values.dtype if self.path == "dense" else torch.float32
        device = self.values.device
        self._attach(module, _dense_update if self.path == "dense" else _op_update,
                     sbd_a_t=a.t().contiguous().to(dtype=dtype, device=device),
                     sbd_b_t=b.t().contiguous().to(dtype=dtype, device=device))
