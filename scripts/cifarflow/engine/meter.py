"""The epoch meter of K runs trained together (K = 1 alone, K fused members): loss and hits
summed on the device, one (K,) tensor each (two kernels a step, whatever K), images and time
since the last (re)start of the clock, folded into each run's checkpointed ``Progress`` when
a save or the epoch's end needs them.

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
    """The runs share one position (batch, images seen) and one clock: the first run's
    progress counts them at every step, the others' are brought up to date at ``fold``."""

    def __init__(self, device):
        self.device = device
        self.runs: list = []                # the runs' Progress records, the first counting
        self.loss = self.hits = None        # device-side sums of the epoch so far, (K,)
        self.mark = 0.0                     # clock start
        self.base_s: list = []              # each run's training seconds before it
        self.seen0 = self.steps0 = 0        # images and steps at the clock start, since
        self.last_log = 0.0
        self.started_at = self.ended_at = None  # the epoch's training window, wall clock

    def start(self, progresses: list) -> None:
        """Accumulators start from the checkpointed partial sums: the same float sequence
        whether or not the epoch was split."""
        self.runs = progresses
        self.loss = torch.tensor([p.loss_sum for p in progresses], dtype=torch.float64,
                                 device=self.device)
        self.hits = torch.tensor([p.correct for p in progresses], dtype=torch.int64,
                                 device=self.device)
        self.restart_clock()
        self.last_log = time.time()

    def restart_clock(self) -> None:
        synchronize(self.device)  # work queued before the start is not this clock's
        self.mark, self.base_s = time.perf_counter(), [p.train_s for p in self.runs]
        self.seen0, self.steps0 = self.runs[0].seen, 0
        if not self.runs[0].seen or self.started_at is None:  # not after a save: the same epoch
            self.started_at = time.time()
        self.ended_at = None

    def add(self, loss, hits, n: int) -> None:
        """One step: ``loss`` the mean loss of each run's batch of ``n`` images (K,) (or
        one run's, a scalar), ``hits`` its correct predictions."""
        # one kernel, not three (cast, multiply, add): a float32 loss times a batch size is
        # exact in float64, so the sum is the same to the bit
        self.loss.add_(loss, alpha=n)
        self.hits += hits
        p = self.runs[0]
        p.seen += n
        p.step += 1
        self.steps0 += 1

    def elapsed(self) -> float:
        """Seconds since the clock started, the device's queued work done first."""
        synchronize(self.device)
        return time.perf_counter() - self.mark

    def step_s(self) -> float:
        """Mean seconds of a step since the clock started (no wait: an estimate per batch)."""
        return (time.perf_counter() - self.mark) / max(1, self.steps0)

    def images_per_sec(self, world_size: int) -> float:
        """Images a second of one run (all its ranks)."""
        return (self.runs[0].seen - self.seen0) * world_size / self.elapsed()

    def due_for_log(self, interval_s: float) -> bool:
        if time.time() - self.last_log < interval_s:
            return False
        self.last_log = time.time()
        return True

    def fold(self) -> None:
        """Copy the device-side sums into the (checkpointed) progress records, with the
        shared position and each run's training time."""
        first = self.runs[0]
        sums = zip(self.loss.tolist(), self.hits.tolist())
        elapsed = self.elapsed()  # after the device's sync: the queued steps are timed
        for p, base_s, (loss, hits) in zip(self.runs, self.base_s, sums):
            p.loss_sum, p.correct = loss, hits
            p.step, p.seen = first.step, first.seen
            p.train_s = base_s + elapsed
        self.ended_at = time.time()
