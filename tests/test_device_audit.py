"""The tests' own care for GPU runs (`SBD_TEST_DEVICE=cuda`): the device audit (tests/device_audit.py,
`SBD_TEST_DEVICE_AUDIT=1`) flags on the CPU what a GPU run would refuse, and a shared tiny model is handed
back as built whatever a test did to it (conftest's `restore_shared_models`, after every test)."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, _model, attach_random_adapter, restore_shared_models

import device_audit
from sbd.drafters import adapter as adapters
from sbd.drafters import sampler_head as heads
from sbd.masks import tree_mask


@pytest.fixture
def audit(monkeypatch):
    """The audit on for this test alone, armed as in a test that has taken a shared tiny model."""
    for name in device_audit.FACTORIES:
        monkeypatch.setattr(torch, name, getattr(torch, name))  # torch's own functions again after the test
    device_audit.install()
    monkeypatch.setattr(device_audit, "_armed", True)


def test_a_tensor_without_a_device_is_flagged(audit):
    with pytest.raises(device_audit.DeviceAuditError, match=r"test_device_audit.py:\d+: torch.zeros without device="):
        torch.zeros(3)
    with pytest.raises(device_audit.DeviceAuditError, match="torch.tensor without device="):
        torch.tensor([[5, 6, 7]])  # a prompt for the model: on a GPU run it would stay on the CPU
    assert torch.tensor([[5, 6, 7]], device=DEVICE).device.type == DEVICE.type
    assert torch.zeros(3, device="cpu").tolist() == [0.0] * 3


def test_a_cpu_generator_draws_on_the_cpu(audit):
    g = torch.Generator().manual_seed(0)
    # the old conftest's attach_random_adapter under its global default device: "Expected a 'cuda' device
    # type for generator but found 'cpu'" on a GPU run
    with pytest.raises(device_audit.DeviceAuditError, match="torch.randn with a CPU generator and device=None"):
        torch.randn(4, 4, generator=g)
    with pytest.raises(device_audit.DeviceAuditError, match="CPU generator"):
        torch.randint(3, 9, (2,), generator=g, device=DEVICE)  # the model's device: an error on a GPU
    drawn = torch.randn(4, generator=torch.Generator().manual_seed(1), device="cpu").to(DEVICE)
    assert drawn.device.type == DEVICE.type


def test_only_the_tests_own_calls_are_audited_and_only_when_armed(audit, monkeypatch):
    assert tree_mask([]).shape == (0, 0)  # sbd's torch.zeros(0, 0) without a device: library code
    monkeypatch.setattr(device_audit, "_armed", False)  # a test on no shared tiny model: all on the CPU
    assert torch.zeros(2).tolist() == [0.0, 0.0]


def test_a_shared_model_is_handed_back_as_built():
    model = _model("llama")
    attach_random_adapter(model)
    heads.attach(model)
    model.train().requires_grad_(False)
    assert restore_shared_models() == ["a drafting adapter on _model('llama', seed=0)",
                                       "a sampler head on _model('llama', seed=0)"]
    assert adapters.adapter_of(model) is None and heads.head_of(model) is None
    assert not model.training and all(p.requires_grad for p in model.parameters())
    assert restore_shared_models() == []


def test_a_half_made_adapter_is_not_left_behind(monkeypatch):
    """attach_random_adapter failing after the attach (as under the old global default device on a GPU)
    detaches it: the next test does not meet "this model already has a drafting adapter attached"."""
    model = _model("llama")

    def refused(*args, **kwargs):
        raise RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'")

    monkeypatch.setattr(torch, "randn", refused)
    with pytest.raises(RuntimeError, match="generator"):
        attach_random_adapter(model)
    assert adapters.adapter_of(model) is None
