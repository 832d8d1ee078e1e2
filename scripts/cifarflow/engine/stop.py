"""Whether to stop or save at a batch boundary: one value agreed by all ranks."""

from __future__ import annotations

import math
import os
import time

import torch

from .. import slurm
from . import stop_signals
from ..config import stop_after
from ..jobfacts import job_fact


def slurm_end_time() -> float | None:
    """Absolute end of the Slurm job: SLURM_JOB_END_TIME (Slurm >= 23.02), else what the job
    read when it started (job_env)."""
    if os.environ.get("SLURM_JOB_END_TIME", "").isdigit():
        return float(os.environ["SLURM_JOB_END_TIME"])
    return job_fact("JOB_END_TIME", slurm.job_end_time)


class RaisedFlags:
    """The (stop, save) flags of every rank at one batch, all-reduced (max) while the next
    batch trains. On CUDA the result comes back through pinned memory behind an event, so
    reading it waits for that batch's work only, never for the device's queue to drain."""

    def __init__(self, strategy, flags: list[int]):
        local = torch.tensor(flags, dtype=torch.int32)
        self.cuda = strategy.reduce_device != "cpu"
        self.tensor = (local.pin_memory().to(strategy.reduce_device, non_blocking=True)
                       if self.cuda else local)
        self.work = strategy.all_reduce_start(self.tensor, "max")
        if self.cuda:
            self.work.wait()  # the stream waits for the reduction; the host goes on
            self.host = torch.empty_like(local).pin_memory()
            self.host.copy_(self.tensor, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record()

    def read(self) -> list[int]:
        if self.cuda:
            self.ready.synchronize()
            return self.host.tolist()
        self.work.wait()
        return self.tensor.tolist()


class StopController:
    """Whether to stop or save at this batch boundary: one value for all ranks.

    The Slurm executor forwards no warning signal and counts TIMEOUT as failure, so a
    segment times itself: it stops ``config.stop_after(T, margin)`` seconds into its budget
    T, leaving room for the final checkpoint; SIGUSR2/SIGTERM are the backstop. Each rank
    contributes its signal and deadline, rank 0 its save clock.

    Several ranks agree through an all-reduce (max) of the flags. Inside an epoch they act
    on the flags raised one batch before, whose all-reduce ran while this batch trained, so
    no batch waits for the collective (on NCCL, reading it at once would stall the GPU each
    batch); the deadline looks two steps ahead for that. At an epoch's end, where the ranks
    synchronise anyway, they ``settle``: act on every flag raised so far."""

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
        self.last_save = time.time()  # rank 0's save clock: restarts when it asks to save
        self.in_flight: RaisedFlags | None = None  # the flags of the batch before
        stop_signals.listen()

    @property
    def signalled(self) -> str | None:
        return stop_signals.received

    def decide(self, next_step_s: float, may_save: bool,
               settle: bool = False) -> tuple[str | None, bool]:
        """(stop reason or None, save now?) agreed by all ranks."""
        s, now = self.strategy, time.time()
        lagged = s.world_size > 1 and not settle
        ahead = next_step_s * (2 if lagged else 1)
        stop = 2 + s.rank if self.signalled else int(now + ahead > self.deadline)
        save = int(may_save and s.is_main and now - self.last_save >= self.interval_s)
        if save:
            self.last_save = now  # asked once, though acted on a batch later
        if s.world_size > 1:
            stop, save = self.agree([stop, save], settle)
        if stop:
            self.settle()  # nothing left in flight once the segment ends
        if stop >= 2:
            local = self.signalled and stop == 2 + s.rank
            return (f"signal {self.signalled}" if local else f"signal on rank {stop - 2}"), False
        return ("time budget" if stop else None), bool(save)

    def agree(self, flags: list[int], settle: bool) -> list[int]:
        """The flags to act on now: those raised a batch before (none at a segment's first
        batch), or, settling, those and these."""
        raised = RaisedFlags(self.strategy, flags)
        before = self.settle()
        if settle:
            now = raised.read()
        else:
            self.in_flight, now = raised, [0, 0]
        return [max(a, b) for a, b in zip(before, now)]

    def settle(self) -> list[int]:
        """Read and drop the flags in flight ([0, 0] if none)."""
        if self.in_flight is None:
            return [0, 0]
        raised, self.in_flight = self.in_flight, None
        return raised.read()

    def saved(self) -> None:
        self.last_save = time.time()
