"""The meters time the device's work, not its launches: a GPU queues kernels ahead of the
host, so the clock is read after the device's queue is synchronised, when the clock starts
and when the sums are folded, one run's or a fused group's K (one meter, K sums). A fake
device sync and a fake clock record the order of the calls."""

import pytest
import torch

from cifarflow.engine import meter as meter_module
from cifarflow.engine.meter import EpochMeter
from cifarflow.engine.state import Progress


@pytest.fixture
def calls(monkeypatch):
    """Every device sync and clock read, in order: ("sync", device) and ("clock", t)."""
    seen = []
    ticks = iter(range(1, 1000))

    def sync(device):
        seen.append(("sync", str(device)))

    def clock():
        t = float(next(ticks))
        seen.append(("clock", t))
        return t

    monkeypatch.setattr(meter_module, "synchronize", sync)
    monkeypatch.setattr(meter_module.time, "perf_counter", clock)
    return seen


def assert_synced_before_every_clock(seen: list) -> None:
    kinds = [kind for kind, _ in seen]
    assert "clock" in kinds
    for i, kind in enumerate(kinds):
        if kind == "clock":
            assert i > 0 and kinds[i - 1] == "sync", seen


def test_a_runs_meter_reads_the_clock_after_the_device_sync(calls):
    meter = EpochMeter("cuda:0")
    progress = Progress()
    meter.runs = [progress]
    meter.loss = torch.zeros(1, dtype=torch.float64)  # CPU tensors: the sync is the fake's
    meter.hits = torch.zeros(1, dtype=torch.int64)
    meter.restart_clock()
    meter.add(torch.tensor(2.0), torch.tensor(3), 4)
    meter.fold()
    assert_synced_before_every_clock(calls)
    assert calls[-2:] == [("sync", "cuda:0"), ("clock", 2.0)]
    assert progress.train_s == 1.0 and progress.loss_sum == 8.0 and progress.correct == 3


def test_a_fused_groups_meter_reads_the_clock_after_the_device_sync(calls):
    # CPU tensors (the group's sums are made on its device); the fake sync records the
    # calls all the same
    meter = EpochMeter("cpu")
    members = [Progress(train_s=0.5 * k) for k in range(3)]
    meter.start(members)
    del calls[:]
    meter.add(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 0, 1]), 10)
    meter.fold()
    assert calls == [("sync", "cpu"), ("clock", 2.0)]  # fold: the sync, then the clock
    assert [p.loss_sum for p in members] == [10.0, 20.0, 30.0]
    assert [p.correct for p in members] == [1, 0, 1]
    assert {(p.step, p.seen) for p in members} == {(1, 10)}  # the shared position
    # from the start, each member's own training time before it
    assert [p.train_s for p in members] == [1.0, 1.5, 2.0]
    meter.restart_clock()
    assert_synced_before_every_clock(calls)


def test_synchronize_waits_only_for_a_cuda_device(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    meter_module.synchronize("cpu")
    meter_module.synchronize(torch.device("cpu"))
    assert waited == []
    meter_module.synchronize("cuda:1")
    assert waited == ["cuda:1"]
