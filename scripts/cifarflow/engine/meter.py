"""The epoch meter: loss and hits summed on the device, images and time since the last
(re)start of the clock, folded into the checkpointed ``Progress`` when a save or the
epoch's end needs them; and a fused group's, one (K,) sum for its K members.

The clock is read after the device has finished the work queued so far (``synchronize``),
at a start and at a fold: a GPU queues kernels ahead of the host, and a clock read before
the queue drains times the launches, not the work (figures read high). ``step_s`` alone,
the stop controller's estimate of a step read at every batch, does not wait."""

from __future__ import annotations

import time

import torch


def synchronize(device) -> None:
    """Wait for the work queued on ``device`` (a CUDA device; CPU work is done already)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class EpochMeter:
    def __init__(self, device):
        self.device = device
        self.loss = self.hits = None        # device-side sums of the epoch so far
        self.mark = self.base_s = 0.0       # clock start, training seconds before it
        self.seen0 = self.steps0 = 0        # images and steps at the clock start, since
        self.last_log = 0.0
        self.started_at = self.ended_at = None  # the epoch's training window, wall clock

    def start(self, progress) -> None:
        """Accumulators start from the checkpointed partial sums: the same float sequence
        whether or not the epoch was split."""
        self.loss = torch.tensor(progress.loss_sum, dtype=torch.float64, device=self.device)
        self.hits = torch.tensor(progress.correct, dtype=torch.int64, device=self.device)
        self.restart_clock(progress)
        self.last_log = time.time()

    def restart_clock(self, progress) -> None:
        synchronize(self.device)  # work queued before the start is not this clock's
        self.mark, self.base_s = time.perf_counter(), progress.train_s
        self.seen0, self.steps0 = progress.seen, 0
        if not progress.seen or self.started_at is None:  # not after a save: the same epoch
            self.started_at = time.time()
        self.ended_at = None

    def add(self, progress, loss, hits, n: int) -> None:
        # one kernel, not three (cast, multiply, add): a float32 loss times a batch size is
        # exact in float64, so the sum is the same to the bit
        self.loss.add_(loss, alpha=n)
        self.hits += hits
        progress.seen += n
        progress.step += 1
        self.steps0 += 1

    def elapsed(self) -> float:
        """Seconds since the clock started, the device's queued work done first."""
        synchronize(self.device)
        return time.perf_counter() - self.mark

    def step_s(self) -> float:
        """Mean seconds of a step since the clock started (no wait: an estimate per batch)."""
        return (time.perf_counter() - self.mark) / max(1, self.steps0)

    def images_per_sec(self, progress, world_size: int) -> float:
        return (progress.seen - self.seen0) * world_size / self.elapsed()

    def due_for_log(self, interval_s: float) -> bool:
        if time.time() - self.last_log < interval_s:
            return False
        self.last_log = time.time()
        return True

    def fold(self, progress) -> None:
        """Copy the device-side sums into the (checkpointed) progress record."""
        progress.loss_sum, progress.correct = float(self.loss), int(self.hits)
        progress.train_s = self.base_s + self.elapsed()
        self.ended_at = time.time()


class FusedMeter:
    """The group's epoch sums, one (K,) tensor each for loss and hits (two kernels a step,
    whatever K). The first member's meter keeps the clock and the counts; every member's
    progress is brought up to date at ``fold`` (saves, the epoch's end)."""

    def __init__(self, members: list):
        self.members = members
        self.first = members[0]
        self.loss = self.hits = None

    def start(self) -> None:
        device = self.first.meter.device
        for m in self.members:
            m.start_epoch()
        self.loss = torch.tensor([m.progress.loss_sum for m in self.members], dtype=torch.float64,
                                 device=device)
        self.hits = torch.tensor([m.progress.correct for m in self.members], dtype=torch.int64,
                                 device=device)

    def add(self, losses, hits, n: int) -> None:
        self.loss.add_(losses, alpha=n)  # exact in float64, as EpochMeter.add
        self.hits += hits
        p, meter = self.first.progress, self.first.meter
        p.seen += n
        p.step += 1
        meter.steps0 += 1

    def fold(self) -> None:
        """Every member's progress: its sums, the shared position, its training time."""
        p0, meter0 = self.first.progress, self.first.meter
        sums = list(zip(self.loss.tolist(), self.hits.tolist()))
        elapsed = meter0.elapsed()  # after the device's sync: the queued steps are timed
        for m, (loss, hits) in zip(self.members, sums):
            m.progress.loss_sum, m.progress.correct = loss, hits
            m.progress.step, m.progress.seen = p0.step, p0.seen
            m.meter.steps0 = meter0.steps0
            m.progress.train_s = m.meter.base_s + elapsed
            m.meter.ended_at = time.time()

    def restart_clock(self) -> None:
        for m in self.members:
            m.meter.restart_clock(m.progress)

    def log_due(self) -> bool:
        return self.first.meter.due_for_log(self.first.cfg.log_interval_s)
