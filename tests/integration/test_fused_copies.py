"""The copies a vmap-fused step makes (issue 48), counted rather than timed: every operator
that writes a copy of a tensor (``copy_``, ``clone``, ``new_zeros``, ``_to_copy``) as the
step dispatches it below vmap's batching rules (a TorchDispatchMode sees the physical
tensors), for K = 2, 4 and 8. The count is small and the same whatever K: the convolution
weights copied once each into vmap's layout in the forward and never in the backward, no
activation re-laid out around the pooling, no in-place activation on a vmap view copied
back and forth. Timings are bench/fused_cpu.py's."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cifarflow.config import with_defaults
from cifarflow.controller.plan import build_runs
from cifarflow.engine.fused.train import fused_group
from conftest import SYNTHETIC

COPIES = {"copy_", "clone", "new_zeros", "_to_copy", "contiguous"}


class CopyCount(TorchDispatchMode):
    """The copying operators dispatched while it is on, with the elements each wrote; and
    every operator (``operators``)."""

    def __init__(self):
        super().__init__()
        self.calls, self.elements, self.operators = Counter(), Counter(), Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.operators[name] += 1
        if name in COPIES:
            self.calls[name] += 1
            self.elements[name] += out.numel() if isinstance(out, torch.Tensor) else 0
        return out


def configs(k: int, model: str, batch: int, seeds: bool) -> list:
    config = with_defaults({"strategies": ["cpu"], "data": {"synthetic": SYNTHETIC},
                            "train": {"epochs": 2, "batch_size": batch, "model": model},
                            "sweep": {"lr": [0.01 * (i + 1) for i in range(k)],
                                      **({"seed": [0, 1]} if seeds else {})}})
    return [run.config for run in build_runs(config).values()][:k]


def step_copies(k: int, model: str, batch: int, seeds: bool, cifar_dir) -> CopyCount:
    """The copies of one vmap-fused training step (after a warm-up step)."""
    group = fused_group(configs(k, model, batch, seeds), cifar_dir, threads=2, mode="vmap",
                        say=lambda line: None)
    assert group.batches.shared is not seeds
    x, y = next(group.batches.epoch(0))
    group.train_step(x, y)
    with CopyCount() as count:
        group.train_step(x, y)
    return count


def conv_tensors(model: str) -> int:
    """The model's convolution weights and biases: each copied once into the layout the
    fused convolution reads ((K, O) folded into one dimension, which the flat (K, P)
    tensor's row stride does not allow)."""
    from cifarflow.engine.models import build_model

    return sum(1 for m in build_model(model).modules() if isinstance(m, torch.nn.Conv2d)
               for _ in m.parameters())


@pytest.mark.parametrize("seeds", [False, True], ids=["shared-batch", "own-batches"])
def test_a_vmap_lenet_step_copies_its_weights_once_and_few_activations(cifar_dir, seeds):
    """lenet, vmap fusion (its hand-fused forward, engine/fused/nets.py): the same copies at
    K = 2, 4 and 8: each convolution weight and bias once, the flattened features (B x 400
    a member) forward and back, the labels or each member's own input once; 7 in all.
    Before: the same weights copied again 4 times each in the backward and 5 copies of
    the convolutions' outputs (B x 4704 a member) around the pooling, 15 copying
    operators and 11x the elements."""
    counts = {k: step_copies(k, "lenet", 100, seeds, cifar_dir) for k in (2, 4, 8)}
    assert counts[2].calls == counts[4].calls == counts[8].calls, {
        k: dict(c.calls) for k, c in counts.items()}
    assert counts[2].operators == counts[8].operators  # every operator, not only copies
    calls = counts[8].calls
    assert "new_zeros" not in calls  # no weight's gradient rebuilt in the backward
    assert sum(calls.values()) <= conv_tensors("lenet") + 3, dict(calls)
    # each member's share of the bytes copied: its weights, its features, its input
    per_member = counts[8].elements.total() / 8 / 100
    assert per_member < (3072 if seeds else 0) + 1000, dict(counts[8].elements)


def test_a_vmap_resnet18_step_copies_no_activation(cifar_dir):
    """resnet18, vmap fusion, batch 8: the same copies at K = 2 and 4, its convolution
    weights once each (into vmap's layout) and the labels: no activation. Before: 118
    ``copy_``, 49 ``clone`` and 34 ``new_zeros`` a step at K = 2, of in-place ReLUs and
    ``out += identity`` on vmap's views and 4 per convolution weight in the backward."""
    counts = {k: step_copies(k, "resnet18", 8, False, cifar_dir) for k in (2, 4)}
    assert counts[2].calls == counts[4].calls, {k: dict(c.calls) for k, c in counts.items()}
    # and every operator: none that vmap runs member by member (its fallback for an
    # operator without a batching rule, as adaptive_avg_pool2d's as_strided_ had)
    assert counts[2].operators == counts[4].operators, \
        (counts[4].operators - counts[2].operators, counts[2].operators - counts[4].operators)
    calls = counts[4].calls
    assert "new_zeros" not in calls
    assert sum(calls.values()) <= conv_tensors("resnet18") + 3, dict(calls)


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_lenets_hand_fused_forward_computes_what_vmap_computes(shared, channels_last):
    """The hand-fused lenet (engine/fused/nets.py) against vmap of the members' own
    forward, 3 members of other weights: the same logits and the same gradients of every
    member's every parameter, to float rounding (grouped convolutions both)."""
    from cifarflow.engine.fused.model import FusedModel
    from cifarflow.engine.models import build_model

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    members = []
    for seed in range(3):
        torch.manual_seed(seed)
        members.append(build_model("lenet").to(memory_format=fmt))
    fused = FusedModel(members, "vmap")
    assert fused.hand_fused is not None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*([] if shared else [3]), 16, 3, 32, 32, generator=gen)
    x = x.contiguous(memory_format=fmt) if shared else torch.stack(
        [xi.contiguous(memory_format=fmt) for xi in x])
    results = []
    for hand in (fused.hand_fused, None):
        fused.hand_fused = hand
        fused.zero_grad()
        out = fused.forward(x, shared_input=shared)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        results.append((out.detach(), fused.flat_grad.clone()))
    (hand_out, hand_grad), (vmap_out, vmap_grad) = results
    assert hand_out.shape == (3, 16, 10)
    torch.testing.assert_close(hand_out, vmap_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hand_grad, vmap_grad, rtol=1e-4, atol=1e-5)
    assert hand_grad.abs().sum() > 0
