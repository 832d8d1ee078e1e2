"""The meters time the device's work, not its launches: a GPU queues kernels ahead of the
host, so the clock is read after the device's queue is synchronised, when the clock starts
and when the sums are folded, in a run's meter and in a fused group's. A fake device sync
and a fake clock record the order of the calls."""

from types import SimpleNamespace

import pytest
import torch

from cifarflow.engine import meter as meter_module
from cifarflow.engine.meter import EpochMeter, FusedMeter
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
    meter.loss = torch.zeros((), dtype=torch.float64)  # CPU tensors: the sync is the fake's
    meter.hits = torch.zeros((), dtype=torch.int64)
    meter.restart_clock(progress)
    meter.add(progress, torch.tensor(2.0), torch.tensor(3), 4)
    meter.fold(progress)
    assert_synced_before_every_clock(calls)
    assert calls[-2:] == [("sync", "cuda:0"), ("clock", 2.0)]
    assert progress.train_s == 1.0 and progress.loss_sum == 8.0 and progress.correct == 3


def test_a_fused_groups_meter_reads_the_clock_after_the_device_sync(calls):
    members = []
    for _ in range(3):
        # CPU tensors (the group's sums are made on its device); the fake sync records the
        # calls all the same
        m = SimpleNamespace(progress=Progress(), meter=EpochMeter("cpu"),
                            cfg=SimpleNamespace(log_interval_s=1000))
        m.start_epoch = lambda m=m: (m.meter.start(m.progress))
        members.append(m)
    group = FusedMeter(members)
    group.start()
    del calls[:]
    group.add(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 0, 1]), 10)
    group.fold()
    assert calls == [("sync", "cpu"), ("clock", 4.0)]  # fold: the sync, then the clock
    assert [m.progress.loss_sum for m in members] == [10.0, 20.0, 30.0]
    assert {m.progress.train_s for m in members} == {4.0 - 1.0}  # from the first's start
    group.restart_clock()
    assert_synced_before_every_clock(calls)


def test_synchronize_waits_only_for_a_cuda_device(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    meter_module.synchronize("cpu")
    meter_module.synchronize(torch.device("cpu"))
    assert waited == []
    meter_module.synchronize("cuda:1")
    assert waited == ["cuda:1"]
