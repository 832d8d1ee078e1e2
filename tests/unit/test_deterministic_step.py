"""Deterministic mode costs no extra kernels: seed_everything turns off torch's NaN fill of
new tensors (one more kernel per allocation, paid in full by a small model's host-bound
GPU step), and the fill changes no result of the engine's step."""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from cifarflow.engine.build import seed_everything
from cifarflow.engine.loaders import Split, TensorBatches
from cifarflow.engine.models import build_model


pytestmark = pytest.mark.usefixtures("deterministic_switches_restored")


def lenet_steps(deterministic: bool, steps: int, fill: bool | None = None):
    """The engine's step (its batches, lenet channels_last, SGD momentum) after the
    engine's seeding; ``fill`` overrides the NaN fill afterwards. Returns the model and
    the number of fill kernels of the last step."""
    seed_everything(0, deterministic, compiled=False)
    if fill is not None:
        torch.utils.deterministic.fill_uninitialized_memory = fill
    gen = torch.Generator().manual_seed(1)
    split = Split(torch.randint(0, 256, (512, 3, 32, 32), dtype=torch.uint8, generator=gen),
                  torch.randint(0, 10, (512,), generator=gen))
    model = build_model("lenet", {}).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = list(TensorBatches(split, 64, seed=0).epoch(0))[:steps]

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for x, y in batches[:-1]:
        step(x, y)
    with profile() as prof:
        step(*batches[-1])
    fills = sum(e.count for e in prof.key_averages() if e.key == "aten::fill_")
    return model, fills


def test_a_deterministic_step_launches_no_more_kernels_than_a_free_one():
    _, free = lenet_steps(deterministic=False, steps=3)
    _, engine = lenet_steps(deterministic=True, steps=3)
    _, torch_default = lenet_steps(deterministic=True, steps=3, fill=True)
    assert engine == free
    assert torch_default > engine  # what the switch saves: the profiler sees the fills


def test_the_fill_changes_no_result():
    filled, _ = lenet_steps(deterministic=True, steps=6, fill=True)
    engine, _ = lenet_steps(deterministic=True, steps=6)
    for (name, a), b in zip(filled.state_dict().items(), engine.state_dict().values()):
        assert torch.equal(a, b), name
