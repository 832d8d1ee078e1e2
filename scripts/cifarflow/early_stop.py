"""Early stopping and plateau notes, per run, from its epoch records alone.

``train.early_stop`` follows Lightning's EarlyStopping: after each epoch the metric
improves when it beats the best so far by more than ``min_delta`` (lower for ``min``,
higher for ``max``); ``patience`` epochs in a row without an improvement stop the run.
The verdict is a pure function of the run's history (``metrics.jsonl``), which every
checkpoint carries, so it survives segment boundaries and resumes bit-exactly, and a
fused or packed member decides for itself from its own records. Whether or not early
stopping is on, a train loss that has not moved for ``patience`` epochs is named (the
epoch log and the advice), with what to try for a model known to do so. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = {"train_loss": "min", "train_acc": "max", "test_acc": "max"}
LOSS_DELTA = 1e-3  # the loss watch's min_delta where early_stop watches another metric

# models known to plateau, and why: the seed's LeNet keeps a ReLU on its logits
MODEL_HINTS = {
    "lenet": ("lenet (the seed's Net) ends in a ReLU on its logits: a class whose logit is "
              "pushed below zero gets no gradient again and is never predicted, so the loss "
              "stays put; try a lower train.lr (or scheduler: cosine), or a model without "
              "that ReLU (resnet18, or your own as module:factory, see examples/my_model.py)"),
}


@dataclass(frozen=True)
class Plateau:
    metric: str
    best: float
    best_epoch: int        # 1-based epoch of the best value
    epochs: int            # epochs since then without an improvement
    min_delta: float

    def describe(self) -> str:
        return (f"{self.metric} has not improved by more than {self.min_delta:g} for "
                f"{self.epochs} epoch(s) (best {self.best:.4f} at epoch {self.best_epoch})")


@dataclass(frozen=True)
class Watch:
    """One metric watched over the epoch records."""

    metric: str
    mode: str              # min | max
    patience: int
    min_delta: float

    def __post_init__(self):
        if self.metric not in MODES:
            raise ValueError(f"train.early_stop.metric {self.metric!r}: one of "
                             f"{', '.join(MODES)}")
        if self.patience < 1 or self.min_delta < 0:
            raise ValueError("train.early_stop: patience must be >= 1 and min_delta >= 0")

    def plateau(self, history: list[dict]) -> Plateau:
        """Where the metric stands after the last record: best so far, epochs since."""
        best, best_epoch, wait = None, 0, 0
        for rec in history:
            value = rec[self.metric]
            if best is None or (value < best - self.min_delta if self.mode == "min"
                                else value > best + self.min_delta):
                best, best_epoch, wait = value, rec["epoch"], 0
            else:
                wait += 1
        return Plateau(self.metric, best if best is not None else float("nan"), best_epoch,
                       wait, self.min_delta)

    def stalled(self, history: list[dict]) -> Plateau | None:
        """The plateau once it has lasted ``patience`` epochs, else None."""
        found = self.plateau(history)
        return found if found.epochs >= self.patience else None


@dataclass(frozen=True)
class EarlyStop:
    """A run's ``train.early_stop`` (``TrainConfig.early_stop``): the stop rule, when on,
    and the train-loss watch that names a plateau whether or not it is on."""

    enabled: bool
    rule: Watch
    loss: Watch
    model: str

    @classmethod
    def of(cls, settings: dict, model: str) -> "EarlyStop":
        metric = settings["metric"]
        mode = MODES.get(metric, "min") if settings["mode"] == "auto" else settings["mode"]
        rule = Watch(metric, mode, int(settings["patience"]), float(settings["min_delta"]))
        loss = rule if metric == "train_loss" and mode == "min" else Watch(
            "train_loss", "min", rule.patience, LOSS_DELTA)
        return cls(bool(settings["enabled"]), rule, loss, model)

    def stop_reason(self, history: list[dict]) -> str:
        """Why the run stops here ('' while it goes on, and always when it is off)."""
        found = self.rule.stalled(history) if self.enabled else None
        return f"early stop: {found.describe()}" if found else ""

    def loss_plateau(self, history: list[dict]) -> Plateau | None:
        return self.loss.stalled(history)

    def newly_flat(self, history: list[dict]) -> str:
        """The line the epoch log prints once, when the loss has just been flat for
        ``patience`` epochs ('' otherwise)."""
        found = self.loss.plateau(history)
        if found.epochs != self.loss.patience:
            return ""
        return f"WARNING: {found.describe()}: the run stopped learning. {self.hint()}".strip()

    def hint(self) -> str:
        return hint_for(self.model)


def hint_for(model: str) -> str:
    """Why a model's loss may stop moving, and what to try."""
    return MODEL_HINTS.get(model, "try a lower train.lr or a learning-rate schedule")
