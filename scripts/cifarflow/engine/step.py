"""One run's step: the strategy-wrapped model, its optimizer and schedule (one member of
the loop, engine/loop.py); a fused group's is engine/fused/step.py's, with the same face."""

from __future__ import annotations

import torch.nn.functional as F

from .evaluation import evaluate


class PlainStep:
    """The step of the run ``segment`` (a ledger, built: engine/segment.py): its own model,
    optimizer and schedule, whatever the strategy wrapped around them."""

    note = ""                 # what the log line adds after img/s
    ends_diverged = False     # alone, a run whose loss is not finite trains on

    def __init__(self, segment):
        self.members = [segment]
        self.cfg, self.strategy, self.batches = segment.cfg, segment.strategy, segment.batches
        self.model, self.optimizer = segment.model, segment.optimizer
        self.scheduler, self.test_split = segment.scheduler, segment.test_split

    def compute(self, x, y):
        """Loss and correct predictions of one batch (the forward pass every loop uses)."""
        with self.strategy.autocast():
            out = self.model(x)
            loss = F.cross_entropy(out, y, label_smoothing=self.cfg.label_smoothing)
            return loss, (out.argmax(1) == y).sum()

    def train_step(self, x, y):
        loss, hits = self.compute(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return loss.detach(), hits

    def evaluate(self) -> list[dict]:
        """Test accuracy of the model, one dict a member (evaluation.py)."""
        return [evaluate(self.model, self.test_split, self.cfg, self.strategy)]

    def export(self) -> None:
        """The members' own model and optimizer hold the trained state already."""

    def sync_schedules(self) -> None:
        """The schedule stepped with the optimizer already."""

    def without(self, ended: list):
        return None  # its one member ended: nothing left to step
