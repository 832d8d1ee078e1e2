"""A fused pack sets the process-wide switches once, from all its members: deterministic
where any member asks for it, TF32 only where all allow it, whatever the members' order
(before, each member's set-up wrote them and the last one won)."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.utils.deterministic

from conftest import spec
from cifarflow.config import TrainConfig
from cifarflow.engine.fused import train as fused_train
from cifarflow.engine.fused.train import fused_group, process_switches


pytestmark = pytest.mark.usefixtures("deterministic_switches_restored")


def member(run: str, **train) -> TrainConfig:
    return dataclasses.replace(TrainConfig.read(spec("cpu", **train)), run=run)


def test_the_stricter_switch_wins_whatever_the_order():
    cfgs = [member("a", deterministic=False), member("b", deterministic=True)]
    for order in (cfgs, cfgs[::-1]):
        assert process_switches(order).deterministic is True
    tf32 = [SimpleNamespace(deterministic=False, compile=False, tf32_matmul=allow,
                            tf32_cudnn=allow) for allow in (True, False)]  # CUDA runs' fields
    for order in (tf32, tf32[::-1]):
        switches = process_switches(order)
        assert switches.tf32_matmul is False and switches.tf32_cudnn is False
    assert process_switches(cfgs[:1]).deterministic is False


def test_a_fused_group_sets_the_switches_once_for_all_members(cifar_dir, monkeypatch):
    """Members built deterministic last, then first: the process ends deterministic both
    times, the NaN fill off, the switch written once by the group, and the difference said."""
    calls, said = [], []
    real = fused_train.set_determinism
    monkeypatch.setattr(fused_train, "set_determinism",
                        lambda *a: (calls.append(a), real(*a)))
    cfgs = [member("a", deterministic=True), member("b", deterministic=False),
            member("c", deterministic=False)]
    for order in (cfgs, cfgs[::-1]):
        calls.clear()
        torch.use_deterministic_algorithms(False)
        fused_group(order, cifar_dir, threads=1, say=said.append)
        assert calls == [(True, False)]
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is False
    assert said.count("members differ in deterministic: the pack trains with "
                      "deterministic=True for all") == 2
