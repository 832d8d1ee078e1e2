"""A resumed optimizer keeps its state where torch keeps it: FileCheckpointer loads to the
CPU and ``load_state_dict`` places each tensor, so an Adam ``step`` stays on the CPU (or goes
to the parameters' device for a fused or capturable Adam), whatever device the run is on.

On a GPU a ``step`` mapped onto the device makes foreach Adam read it back to the host, a
sync per parameter per step (issue 58); tests/gpu holds that no sync is left. Here the
checkpointer's strategy says its device is "cuda:0" while the model trains on the CPU: a
load that maps the checkpoint onto the strategy's device puts the state on the GPU (or,
without one, cannot load it at all)."""

import pytest
import torch

from cifarflow.engine.checkpoints.files import FileCheckpointer
from cifarflow.engine.models import build_model
from cifarflow.engine.strategies.base import Strategy


class OnDevice:
    """The strategy as the checkpointer sees it: a device, rank 0, a barrier."""

    def __init__(self, device: str):
        self.device, self.is_main = device, True

    def barrier(self) -> None:
        pass


OPTIMIZERS = {
    "sgd momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adam foreach": lambda params: torch.optim.Adam(params, lr=1e-3, foreach=True),
}


def trained(make, steps: int = 2):
    torch.manual_seed(0)
    model = build_model("lenet")
    optimizer = make(model.parameters())
    for _ in range(steps):
        loss = model(torch.randn(8, 3, 32, 32)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_resumed_optimizers_state_lives_where_torch_keeps_it(tmp_path, name):
    make = OPTIMIZERS[name]
    model, optimizer = trained(make)
    FileCheckpointer(OnDevice("cpu")).save(
        tmp_path / "ckpt", {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "trainer": {}}, {}, {})
    torch.manual_seed(1)
    resumed_model = build_model("lenet")
    resumed = make(resumed_model.parameters())
    state = FileCheckpointer(OnDevice("cuda:0")).load(tmp_path / "ckpt", {})
    strategy = Strategy.__new__(Strategy)  # its load methods only: no set-up
    strategy.load_model_state(resumed_model, state["model"])
    strategy.load_optimizer_state(resumed_model, resumed, state["optimizer"])
    for p, q in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(p, q)
        kept, loaded = optimizer.state[p], resumed.state[q]
        assert kept.keys() == loaded.keys()
        for key, value in kept.items():  # where torch keeps it: as in the optimizer that ran
            assert loaded[key].device == value.device, (name, key, loaded[key].device)
            assert torch.equal(loaded[key], value)
