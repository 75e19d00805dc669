"""The device audit (on by default; SBD_TEST_DEVICE_AUDIT=0 turns it off): a CPU stand-in for the device errors of a GPU run (`SBD_TEST_DEVICE=cuda`).

On a GPU run the shared tiny models live on the GPU while a tensor made without `device=` lands on the
CPU, and a CPU `torch.Generator` cannot draw on the GPU; on a CPU-only machine every tensor is on the
CPU and none of this shows. So, with the audit on, once a test has taken a shared tiny model
(`conftest._model`, also through the `model`/`llama` fixtures) the torch factory functions called from
test code (any file under tests/, conftest's helpers included) must say where their tensor goes:

- `device=` given (the model's device, `conftest.DEVICE`, for what meets the model; "cpu" for host values);
- a CPU generator draws on the CPU, written `device="cpu"` (then `.to(model.device)`): so the draws are
  the same on every device, and `device=model.device` with a CPU generator (an error on a GPU) is flagged.

Library code is not audited (only the tests' own calls). Cost: one Python call per factory call, only
while the audit is on; a TorchFunctionMode (every torch op through Python) cost +40-50% on decoding.
"""

from __future__ import annotations

import functools
import os
import sys

import torch

ENABLED = os.environ.get("SBD_TEST_DEVICE_AUDIT", "1") not in ("", "0")  # on unless set to 0
TESTS = os.path.dirname(os.path.abspath(__file__)) + os.sep
# torch's factory functions that place their tensor on the default device (torch.utils._device's list,
# less the sparse, window, quantized and nested ones)
FACTORIES = ("arange", "as_tensor", "asarray", "empty", "empty_strided", "eye", "full", "linspace", "logspace",
             "ones", "rand", "randint", "randn", "randperm", "scalar_tensor", "tensor", "tril_indices",
             "triu_indices", "zeros")

_armed = False


class DeviceAuditError(AssertionError):
    pass


def arm() -> None:
    """The current test holds a shared tiny model (on conftest.DEVICE): audit its factory calls."""
    global _armed
    _armed = True


def disarm() -> None:
    global _armed
    _armed = False


def check(name: str, kwargs: dict, caller) -> None:
    """Raise if a factory call from test code would put its tensor on the wrong device on a GPU run."""
    if not caller.f_code.co_filename.startswith(TESTS):
        return
    where = f"{os.path.relpath(caller.f_code.co_filename, TESTS)}:{caller.f_lineno}"
    device, gen = kwargs.get("device"), kwargs.get("generator")
    if gen is not None and gen.device.type == "cpu" and device != "cpu":
        raise DeviceAuditError(f"{where}: torch.{name} with a CPU generator and device={device!r}: it draws on "
                               "the CPU on every device: device=\"cpu\", then .to(model.device)")
    if device is None:
        raise DeviceAuditError(f"{where}: torch.{name} without device= (a test on a shared tiny model): "
                               "device=model.device for what meets the model, device=\"cpu\" for host values")


def _audited(name: str, orig):
    @functools.wraps(orig)
    def factory(*args, **kwargs):
        if not torch.compiler.is_compiling() and _armed:  # compiled code: library code, never audited
            check(name, kwargs, sys._getframe(1))
        return orig(*args, **kwargs)

    return factory


def install() -> None:
    """Wrap torch's factory functions (once, for the session); they check only while armed."""
    from torch.utils._device import _device_constructors

    _device_constructors()  # cached with the original functions (torch.set_default_device's list)
    for name in FACTORIES:
        orig = getattr(torch, name)
        if getattr(orig, "__wrapped__", None) is None:
            setattr(torch, name, _audited(name, orig))


def default_device_is_cpu() -> None:
    """Tests never set a global default device: each tensor says where it goes."""
    if torch.get_default_device().type != "cpu":
        raise DeviceAuditError(f"the default device is {torch.get_default_device()}: tests build their tensors "
                               "on the shared tiny models' device explicitly (conftest.DEVICE, model.device)")
