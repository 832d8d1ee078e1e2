"""Building what a segment trains: seeds and RNG states, model, optimizer, schedule,
batches. Each a function of the run's config and the strategy."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
import torch.utils.deterministic  # noqa: F401  (the fill switch)

from ..config import TrainConfig
from .loaders import TensorBatches, TorchvisionBatches
from .models import build_model


def seed_everything(seed: int, deterministic: bool, compiled: bool) -> None:
    seed_rngs(seed)
    set_determinism(deterministic, compiled)


def seed_rngs(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_determinism(deterministic: bool, compiled: bool) -> None:
    """torch's process-wide deterministic switch (and the NaN fill off)."""
    if deterministic and compiled:
        torch.use_deterministic_algorithms(True, warn_only=True)
    elif deterministic:
        # what the public call does minus importing torch._inductor (1.3 s of start-up),
        # which only torch.compile reads
        torch._C._set_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new uninitialised tensor with NaN, a guard for
    # code that reads memory it never wrote. The engine writes all it reads, so the fills
    # change no result (tests/unit/test_deterministic_step.py); they cost a kernel each,
    # 42 more in a lenet step, which a small model's host-bound GPU step pays in full.
    torch.utils.deterministic.fill_uninitialized_memory = False


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this rank's device only
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        # into this rank's device, however many devices this task sees now
        torch.cuda.set_rng_state(state["cuda"].cpu())


def build_optimizer(cfg: TrainConfig, params):
    lr = cfg.effective_lr()
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)


def build_scheduler(cfg: TrainConfig, optimizer, steps_per_epoch: int):
    """Stepped once per batch, so a resume inside an epoch continues the same curve."""
    total = cfg.epochs * steps_per_epoch
    if cfg.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    if cfg.scheduler == "onecycle":
        pct = min(0.9, max(1.0 / total, cfg.warmup_epochs / cfg.epochs)) if cfg.warmup_epochs else 0.3
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.effective_lr(),
                                                   total_steps=total, pct_start=pct)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def build_batches(cfg: TrainConfig, strategy, data_dir: Path, train_split):
    """This rank's training batches: the in-memory uint8 loader, or the seed's DataLoader."""
    kw = dict(rank=strategy.rank, world_size=strategy.world_size,
              channels_last=cfg.channels_last, device=strategy.device, augment=cfg.augment)
    if cfg.loader == "torchvision":
        return TorchvisionBatches(data_dir, train_split, cfg.batch_size, cfg.seed,
                                  num_workers=cfg.num_workers, **kw)
    return TensorBatches(train_split, cfg.batch_size, cfg.seed, **kw)


def build_placed_model(cfg: TrainConfig, strategy):
    """The model on the strategy's device, channels_last where the strategy keeps it so."""
    model = build_model(cfg.model, cfg.model_args).to(strategy.device)
    if cfg.channels_last and strategy.channels_last_params:
        model = model.to(memory_format=torch.channels_last)
    return model
