"""The training configuration of one run, validated on construction."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

# Fields that change what is trained; a checkpoint refuses to resume if any differs.
# Performance knobs (threads, loader, workers, compile, logging) may change freely.
SHAPING_FIELDS = ("strategy", "model", "epochs", "batch_size", "optimizer", "lr", "momentum",
                  "weight_decay", "scheduler", "warmup_epochs", "seed", "world_size",
                  "lr_scaling", "amp", "data_md5")


@dataclass
class TrainConfig:
    run: str = "run"
    strategy: str = "cpu"
    model: str = "lenet"
    epochs: int = 2
    batch_size: int = 512          # per process
    optimizer: str = "sgd"         # sgd | adam
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    scheduler: str = "none"        # none | cosine | onecycle
    warmup_epochs: float = 0.0     # onecycle's rising part, in epochs
    seed: int = 0
    loader: str = "tensor"         # tensor | torchvision (the seed's per-image path)
    num_workers: int = 0
    channels_last: bool = True
    threads: int = 0               # 0: SLURM_CPUS_PER_TASK, else the rule's threads
    eval_batch_size: int = 1024
    world_size: int = 1            # processes (ranks) for ddp, fsdp, mps, lightning
    device: str = "auto"           # ddp/fsdp/lightning: cpu | cuda | auto (cuda if visible)
    backend: str = "auto"          # auto (nccl on GPU, gloo on CPU) | gloo | nccl | mpi
    lr_scaling: str = "none"       # none | linear | sqrt: lr for N replicas
    compile: bool = False
    tf32_matmul: bool = False
    tf32_cudnn: bool = True
    amp: str = "none"              # none | bf16
    log_interval_s: float = 10.0
    checkpoint_interval_s: float = 300.0
    deterministic: bool = True
    data_md5: str = ""

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise ValueError(f"run {self.run!r}: {msg}")
        need(self.epochs >= 1, "epochs must be >= 1")
        need(self.batch_size >= 1, "batch_size must be >= 1")
        need(self.lr > 0, "lr must be > 0")
        need(self.optimizer in ("sgd", "adam"), f"optimizer must be sgd or adam, not {self.optimizer!r}")
        need(self.scheduler in ("none", "cosine", "onecycle"),
             f"scheduler must be none, cosine or onecycle, not {self.scheduler!r}")
        need(self.loader in ("tensor", "torchvision"), "loader must be tensor or torchvision")
        need(self.num_workers >= 0 and self.threads >= 0, "num_workers and threads must be >= 0")
        need(self.world_size >= 1, "world_size must be >= 1")
        need(self.device in ("auto", "cpu", "cuda"), "device must be auto, cpu or cuda")
        need(self.backend in ("auto", "gloo", "nccl", "mpi"), "backend must be auto, gloo, nccl or mpi")
        need(self.lr_scaling in ("none", "linear", "sqrt"), "lr_scaling must be none, linear or sqrt")
        need(self.amp in ("none", "bf16"), "amp must be none or bf16")

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training option(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def effective_lr(self) -> float:
        """The seed warns lr must follow the number of replicas; this is that rule."""
        scale = {"none": 1.0, "linear": float(self.world_size),
                 "sqrt": float(self.world_size) ** 0.5}[self.lr_scaling]
        return self.lr * scale

    def shaping_hash(self) -> str:
        shaping = {k: getattr(self, k) for k in SHAPING_FIELDS}
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:16]

    def shaping_diff(self, other: dict) -> dict:
        return {k: (other.get(k), getattr(self, k)) for k in SHAPING_FIELDS
                if other.get(k) != getattr(self, k)}
