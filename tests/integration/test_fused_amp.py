"""train.amp in a fused group (issue 48): the fused step runs under the same autocast as a
run alone (the strategy's ``autocast()``, train.amp resolved for the device), so with bf16
its convolutions and matmuls compute in bfloat16, in vmap fusion (lenet's hand-fused
forward, a user's model vmapped) and in loop fusion alike; runs of other amp settings
never share a fused model (tests/unit/test_fuse_plan.py)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cifarflow.config import with_defaults
from cifarflow.controller.plan import build_runs
from cifarflow.engine.fused.train import fused_group
from conftest import SYNTHETIC

COMPUTES = {"convolution", "convolution_backward", "bmm", "baddbmm", "mm", "addmm"}


class Dtypes(TorchDispatchMode):
    """The dtype of the first input of every convolution and matmul dispatched."""

    def __init__(self):
        super().__init__()
        self.seen = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in COMPUTES:
            self.seen[name, next(a.dtype for a in args if isinstance(a, torch.Tensor))] += 1
        return func(*args, **(kwargs or {}))


def group_of(cifar_dir, model: str, mode: str, amp: str):
    config = with_defaults({"strategies": ["cpu"], "data": {"synthetic": SYNTHETIC},
                            "train": {"epochs": 2, "batch_size": 50, "model": model,
                                      "amp": amp},
                            "sweep": {"lr": [0.02, 0.05]}})
    return fused_group([run.config for run in build_runs(config).values()], cifar_dir,
                       threads=2, mode=mode, say=lambda line: None)


@pytest.mark.parametrize("model,mode", [("lenet", "vmap"), ("fused_models:small_bn_net", "vmap"),
                                        ("lenet", "loop")])
def test_a_bf16_fused_step_computes_in_bf16_and_its_losses_are_finite(cifar_dir, model, mode):
    dtypes = {}
    for amp in ("bf16", "none"):
        group = group_of(cifar_dir, model, mode, amp)
        assert group.strategy.amp == amp
        batches = group.batches.epoch(0)
        group.train_step(*next(batches))
        with Dtypes() as seen:
            losses, _ = group.train_step(*next(batches))
        assert torch.isfinite(losses).all() and losses.dtype == torch.float32
        assert group.fused.flat.dtype == torch.float32  # the weights stay float32
        dtypes[amp] = {dtype for (name, dtype) in seen.seen if name == "convolution"}
        assert any(name == "convolution_backward" for name, _ in seen.seen)
    assert dtypes == {"bf16": {torch.bfloat16}, "none": {torch.float32}}, dtypes
