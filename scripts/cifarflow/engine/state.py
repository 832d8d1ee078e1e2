"""The training state a checkpoint carries besides model, optimizer and schedule: where
the run is, the partial sums of the epoch in progress, and its records."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field


@dataclass
class Progress:
    epoch: int = 0            # 0-based epoch in progress
    step: int = 0             # batches done in that epoch
    loss_sum: float = 0.0     # partial-epoch accumulators of this rank
    correct: int = 0
    seen: int = 0
    train_s: float = 0.0      # wall time of this epoch's training so far
    ranks: list = field(default_factory=list)   # [loss_sum, correct, seen, train_s] of every rank
    history: list = field(default_factory=list)
    events: list = field(default_factory=list)  # logged fallbacks, carried to summary.csv
    segment_runs: list = field(default_factory=list)  # each segment attempt that got to its end
    resizes: list = field(default_factory=list)  # elastic world-size changes: epoch, from, to

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict) -> "Progress":
        return cls(**state)

    def take_rank_share(self, rank: int) -> None:
        """This rank's partial sums, from the checkpoint's row of every rank."""
        loss_sum, correct, seen, self.train_s = self.ranks[rank]
        self.loss_sum, self.correct, self.seen = loss_sum, int(correct), int(seen)

    def next_epoch(self) -> None:
        self.epoch, self.step, self.loss_sum, self.correct, self.seen, self.train_s = (
            self.epoch + 1, 0, 0.0, 0, 0, 0.0)


def slurm_restarts() -> int:
    """How often Slurm requeued this job (the workflow passes it on past the jobstep)."""
    return int(os.environ.get("SLURM_RESTART_COUNT")
               or os.environ.get("CIFARFLOW_SLURM_RESTART_COUNT") or 0)
