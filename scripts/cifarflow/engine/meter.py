"""The epoch meter: loss and hits summed on the device, images and time since the last
(re)start of the clock, folded into the checkpointed ``Progress`` when a save or the
epoch's end needs them."""

from __future__ import annotations

import time

import torch


class EpochMeter:
    def __init__(self, device):
        self.device = device
        self.loss = self.hits = None        # device-side sums of the epoch so far
        self.mark = self.base_s = 0.0       # clock start, training seconds before it
        self.seen0 = self.steps0 = 0        # images and steps at the clock start, since
        self.last_log = 0.0

    def start(self, progress) -> None:
        """Accumulators start from the checkpointed partial sums: the same float sequence
        whether or not the epoch was split."""
        self.loss = torch.tensor(progress.loss_sum, dtype=torch.float64, device=self.device)
        self.hits = torch.tensor(progress.correct, dtype=torch.int64, device=self.device)
        self.restart_clock(progress)
        self.last_log = time.time()

    def restart_clock(self, progress) -> None:
        self.mark, self.base_s = time.perf_counter(), progress.train_s
        self.seen0, self.steps0 = progress.seen, 0

    def add(self, progress, loss, hits, n: int) -> None:
        # one kernel, not three (cast, multiply, add): a float32 loss times a batch size is
        # exact in float64, so the sum is the same to the bit
        self.loss.add_(loss, alpha=n)
        self.hits += hits
        progress.seen += n
        progress.step += 1
        self.steps0 += 1

    def elapsed(self) -> float:
        return time.perf_counter() - self.mark

    def step_s(self) -> float:
        """Mean seconds of a step since the clock started."""
        return self.elapsed() / max(1, self.steps0)

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
