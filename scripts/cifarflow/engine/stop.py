"""Whether to stop or save at a batch boundary: one value agreed by all ranks."""

from __future__ import annotations

import math
import os
import time

import torch

from .. import slurm, stop_signals
from ..config import stop_after


def slurm_end_time() -> float | None:
    """Absolute end of the Slurm job: SLURM_JOB_END_TIME, else ask squeue."""
    if os.environ.get("SLURM_JOB_END_TIME", "").isdigit():
        return float(os.environ["SLURM_JOB_END_TIME"])
    job = os.environ.get("SLURM_JOB_ID")
    return slurm.job_end_time(job) if job else None


class StopController:
    """Whether to stop or save at this batch boundary: one value for all ranks.

    The Slurm executor forwards no warning signal and counts TIMEOUT as failure, so a
    segment times itself: it stops ``config.stop_after(T, margin)`` seconds into its budget
    T, leaving room for the final checkpoint; SIGUSR2/SIGTERM are the backstop. Each rank
    contributes its signal and deadline, rank 0 its save clock; one all-reduce (max) of the two flags makes
    every rank stop or save at the same batch."""

    def __init__(self, budget_s: float | None, margin_s: float, strategy, start: float,
                 interval_s: float):
        self.strategy, self.interval_s = strategy, interval_s
        deadlines = []
        if budget_s:
            deadlines.append(start + stop_after(budget_s, margin_s))
        end = slurm_end_time()
        if end:
            deadlines.append(start + stop_after(end - start, margin_s))
        self.deadline = min(deadlines) if deadlines else math.inf
        self.last_save = time.time()
        stop_signals.listen()

    @property
    def signalled(self) -> str | None:
        return stop_signals.received

    def decide(self, next_step_s: float, may_save: bool) -> tuple[str | None, bool]:
        """(stop reason or None, save now?) agreed by all ranks."""
        s, now = self.strategy, time.time()
        stop = 2 + s.rank if self.signalled else int(now + next_step_s > self.deadline)
        save = int(may_save and s.is_main and now - self.last_save >= self.interval_s)
        if s.world_size > 1:
            flags = s.all_reduce(torch.tensor([stop, save], device=s.reduce_device), "max")
            stop, save = int(flags[0]), int(flags[1])
        if stop >= 2:
            local = self.signalled and stop == 2 + s.rank
            return (f"signal {self.signalled}" if local else f"signal on rank {stop - 2}"), False
        return ("time budget" if stop else None), bool(save)

    def saved(self) -> None:
        self.last_save = time.time()
