"""Configuration: the schema is the one source of defaults; a run is a typed ``TrainConfig``.

The workflow plans every run at parse time (``plan.build_runs``) into a ``TrainConfig``,
so its errors surface in ``snakemake -n``; a training job reads that object back from the
run's ``spec.json``. No torch here: the Snakefile imports this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .model_cards import NO_AUGMENT, card_of
from .schema import fill_defaults, schema

# Fields that change what is trained; a checkpoint refuses to resume if any differs.
# Performance knobs (threads, loader, workers, compile, logging, segment budget) may change,
# and so may early_stop: it decides when a run ends, never what a step computes (the weights
# at every epoch are the same with it or without), so it may be switched on for a run that
# is under way; the stop is a pure function of the checkpointed epoch records.
SHAPING_FIELDS = ("strategy", "model", "model_args", "epochs", "batch_size", "optimizer", "lr",
                  "momentum", "weight_decay", "scheduler", "warmup_epochs", "seed", "world_size",
                  "lr_scaling", "amp", "data_id", "augment", "label_smoothing")

# Shaping fields added since the first checkpoints, with the value that trains as before
# them: a checkpoint that lacks one trained with that value, and a config that has it hashes
# as if it were absent, so upgrading resumes the runs under way (eval.tta is not shaping).
NEUTRAL = {"augment": dict(NO_AUGMENT), "label_smoothing": 0.0}

AUTO = "auto"


def resolve_augment(model: str, augment: dict | None) -> dict:
    """train.augment with each "auto" (or missing) key replaced by the model's default
    (its card: model_cards.py): the one place a model's augmentation is decided."""
    known = card_of(model).augment
    given = dict(augment or {})
    return {key: known[key] if given.get(key, AUTO) == AUTO else given[key]
            for key in ("flip", "crop")}

# A segment with a time budget T stops at T - margin_s: the engine already stops before a
# batch (and the save that may follow it, at its measured cost) would end past that, so the
# margin is for the final checkpoint and the job's end. (It stopped at min(0.8 T, T -
# margin_s): a 24 h request trained 19.2 h, which hurt backfill.) The engine keeps that rule
# (stop_after); autosize inverts it (budget_for).
def stop_after(budget_s: float, margin_s: float) -> float:
    """Seconds into a budget of ``budget_s`` at which a segment stops training."""
    return max(0.0, budget_s - margin_s)


def budget_for(train_s: float, margin_s: float) -> float:
    """The smallest budget whose stop_after is ``train_s``: what a segment must ask for."""
    return train_s + margin_s


def with_defaults(config: dict) -> dict:
    """A user config completed from the schema, as snakemake's ``validate`` does."""
    return fill_defaults(config, schema())


# $NAME or ${NAME}, as a shell writes a variable (and os.path.expandvars reads it)
VARIABLE = re.compile(r"\$(?:\{([^}]*)\}|(\w+))")


def expand_path(key: str, value: str, environ=os.environ) -> str:
    """A folder of the config as a shell would read it (results: /project/def-pi/$USER/cifar,
    ~/cifar): its $NAME, ${NAME} and ~ expanded; raises ValueError naming a variable that is
    not set here (else a folder literally named "$USER" would be made)."""
    unset = [a or b for a, b in VARIABLE.findall(value) if (a or b) not in environ]
    if unset:
        raise ValueError(f"{key}: {value} names ${unset[0]}, which is not set here: export "
                         f"{unset[0]} or write the folder out in {key}")
    expanded = VARIABLE.sub(lambda m: environ[m.group(1) or m.group(2)], value)
    if expanded == "~" or expanded.startswith("~/"):
        expanded = (environ.get("HOME") or os.path.expanduser("~")) + expanded[1:]
    return os.path.expanduser(expanded)  # ~user/...


def with_paths_expanded(config: dict, environ=os.environ) -> dict:
    """The config with results: expanded (expand_path), where the plan reads it."""
    return {**config, "results": expand_path("results", str(config["results"]), environ)}


def data_identity(data: dict) -> str:
    """What shaped the training data: the archive's md5, or every synthetic parameter."""
    if data["source"] == "synthetic":
        params = json.dumps(data["synthetic"], sort_keys=True)
        return "synthetic-" + hashlib.sha256(params.encode()).hexdigest()[:12]
    return data["md5"]


@dataclass(frozen=True)
class TrainConfig:
    """Everything one run's processes need; no defaults of its own (see ``plan``)."""

    run: str
    strategy: str
    model: str                     # registered name or "package.module:factory"
    model_args: dict               # keyword arguments of a module:factory model
    epochs: int
    batch_size: int                # per process
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    scheduler: str
    warmup_epochs: float
    seed: int
    loader: str
    num_workers: int
    channels_last: bool
    compile: bool
    amp: str
    tf32_matmul: bool
    tf32_cudnn: bool
    eval_batch_size: int
    log_interval_s: float
    checkpoint_interval_s: float
    deterministic: bool
    tensorboard: bool              # train.tensorboard: event files written (a report knob)
    world_size: int                # processes (ranks)
    nodes: int
    device: str                    # cpu | cuda | auto
    backend: str                   # auto | gloo | nccl | mpi
    lr_scaling: str
    data_id: str
    margin_s: float                # segment stops at stop_after(T, margin_s)
    budget_s: float                # 0: the job's runtime is the budget
    elastic: bool                  # may resume on another world size at an epoch boundary
    keep_weights: str              # all | last: earlier segments' weights dropped (and best)
    early_stop: dict               # train.early_stop (cifarflow.early_stop)
    augment: dict                  # train.augment resolved: {flip: bool, crop: pixels}
    label_smoothing: float         # F.cross_entropy's label_smoothing of the training loss
    tta: str                       # eval.tta: none | flip (test accuracy over image and mirror)

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise ValueError(f"run {self.run!r}: {msg}")
        need(self.epochs >= 1 and self.batch_size >= 1, "epochs and batch_size must be >= 1")
        need(self.lr > 0, "lr must be > 0")
        need(self.num_workers >= 0, "num_workers must be >= 0")
        need(self.world_size >= 1 and self.nodes >= 1, "world_size and nodes must be >= 1")
        need(self.world_size % self.nodes == 0,
             f"world_size {self.world_size} is not a multiple of nodes {self.nodes}")
        need(self.checkpoint_interval_s > 0, "checkpoint_interval_s must be > 0")
        # settings that would otherwise be silently ignored
        need(not (self.backend == "nccl" and self.device == "cpu"),
             "backend nccl needs device cuda (nccl has no CPU tensors); use gloo on CPU")
        need(self.num_workers == 0 or self.loader == "torchvision",
             f"num_workers {self.num_workers} applies to loader: torchvision only (the tensor "
             "loader has no workers); set num_workers: 0 or loader: torchvision")
        need(not (self.tf32_matmul and self.device == "cpu"),
             "tf32_matmul applies to CUDA matmuls only and this run trains on cpu")
        need(not self.model_args or ":" in self.model,
             f"model_args apply to a module:factory model only; {self.model} takes none")
        aug = self.augment
        need(isinstance(aug, dict) and set(aug) == {"flip", "crop"}
             and isinstance(aug["flip"], bool) and isinstance(aug["crop"], int)
             and not isinstance(aug["crop"], bool) and 0 <= aug["crop"] <= 16,
             f"augment must be {{flip: true|false, crop: 0..16 pixels}} as resolved by the plan "
             f"(config.resolve_augment), not {aug!r}")
        need(0 <= self.label_smoothing < 1, "label_smoothing must be in [0, 1)")
        need(self.tta in ("none", "flip"), f"tta must be none or flip, not {self.tta!r}")
        self.stopping()  # its own checks

    def stopping(self):
        """The run's early-stop rule and loss watch (cifarflow.early_stop)."""
        from .early_stop import EarlyStop

        return EarlyStop.of(self.early_stop, self.model)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        missing = [n for n in names if n not in d]
        if unknown or missing:
            raise ValueError(f"run spec does not match this version of cifarflow (unknown: "
                             f"{unknown}, missing: {missing}); rerun snakemake to rewrite it")
        return cls(**d)

    @classmethod
    def read(cls, path: Path) -> "TrainConfig":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read run spec {path}: {exc}") from exc

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        """The spec.json text: the same config gives the same text."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    def write(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)

    def effective_lr(self) -> float:
        """The seed warns lr must follow the number of replicas; this is that rule."""
        scale = {"none": 1.0, "linear": float(self.world_size),
                 "sqrt": float(self.world_size) ** 0.5}[self.lr_scaling]
        return self.lr * scale

    def shaping_hash(self) -> str:
        shaping = {k: getattr(self, k) for k in SHAPING_FIELDS
                   if k not in NEUTRAL or getattr(self, k) != NEUTRAL[k]}
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]

    def shaping_diff(self, other: dict) -> dict:
        """The shaping fields whose value in ``other`` (a checkpoint's config) differs; a
        field ``other`` predates counts as its NEUTRAL value."""
        old = {k: other.get(k, NEUTRAL.get(k)) for k in SHAPING_FIELDS}
        return {k: (old[k], getattr(self, k)) for k in SHAPING_FIELDS
                if old[k] != getattr(self, k)}
