"""The one training loop every strategy runs.

``train_segment`` trains a run from its last checkpoint up to ``until_epoch`` (or until its
time budget or a SIGUSR2/SIGTERM says stop, at a batch boundary), then writes a checkpoint
and the metric history. Trained in K segments or one, the weights are bit-identical: the
checkpoint holds model, optimizer, scheduler, RNG states, the position inside the epoch
and the partial-epoch accumulators, and the data order is a pure function of (seed, epoch).
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import checkpoint as ckpt
from .config import TrainConfig
from .loaders import Split, TensorBatches, TorchvisionBatches, eval_batches
from .models import build_model

METRICS = "metrics.jsonl"


# ---- building blocks -------------------------------------------------------------------

def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


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


def peak_memory_mb(device: str) -> float:
    if str(device).startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def gpu_utilization(device: str) -> float | None:
    if not str(device).startswith("cuda"):
        return None
    try:
        return float(torch.cuda.utilization(device))
    except Exception:  # needs NVML; absent on some nodes
        return None


# ---- stopping ----------------------------------------------------------------------------

def slurm_end_time() -> float | None:
    """Absolute end of the Slurm job: SLURM_JOB_END_TIME, else ask squeue."""
    if os.environ.get("SLURM_JOB_END_TIME", "").isdigit():
        return float(os.environ["SLURM_JOB_END_TIME"])
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    import subprocess
    from datetime import datetime

    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        return datetime.fromisoformat(out).timestamp()
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


class StopController:
    """Stop at a batch boundary when the time budget is nearly spent or on a signal.

    The Slurm executor forwards no warning signal and counts TIMEOUT as failure, so the
    segment times itself: it stops at min(0.8 T, T - margin) of its budget T, leaving
    room for the final checkpoint; SIGUSR2/SIGTERM (e.g. ``--signal=B:USR2@90``) are the
    backstop. Ranks agree by an all-reduce, so all stop at the same batch."""

    def __init__(self, budget_s: float | None, margin_s: float, strategy, start: float):
        self.strategy, self.signalled = strategy, None
        deadlines = []
        if budget_s:
            deadlines.append(start + min(0.8 * budget_s, budget_s - margin_s))
        end = slurm_end_time()
        if end:
            remaining = end - start
            deadlines.append(start + min(0.8 * remaining, remaining - margin_s))
        self.deadline = min(deadlines) if deadlines else math.inf
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        self.signalled = signal.Signals(signum).name

    def should_stop(self, next_step_s: float) -> str | None:
        local = 0
        if self.signalled:
            local = 2
        elif time.time() + next_step_s > self.deadline:
            local = 1
        if self.strategy.world_size > 1:
            nccl = getattr(self.strategy, "backend_name", "") == "nccl"
            flag = torch.tensor([local], device=self.strategy.device if nccl else "cpu")
            local = int(self.strategy.all_reduce(flag, "max").item())
        return {0: None, 1: "time budget", 2: f"signal {self.signalled or 'on another rank'}"}[local]


# ---- the loop ----------------------------------------------------------------------------

@dataclass
class Progress:
    epoch: int = 0            # 0-based epoch in progress
    step: int = 0             # batches done in that epoch
    loss_sum: float = 0.0     # partial-epoch accumulators (this rank)
    correct: int = 0
    seen: int = 0
    train_s: float = 0.0      # wall time of this epoch's training so far
    history: list = field(default_factory=list)


class Trainer:
    def __init__(self, cfg: TrainConfig, strategy, data_dir: Path, out_dir: Path,
                 resume_dir: Path | None = None, work_dir: Path | None = None,
                 until_epoch: int | None = None, budget_s: float | None = None,
                 margin_s: float = 60.0, start_time: float | None = None):
        self.cfg, self.s = cfg, strategy
        self.data_dir, self.out_dir = Path(data_dir), Path(out_dir)
        self.resume_dir = Path(resume_dir) if resume_dir else None
        self.work_dir = Path(work_dir) if work_dir else None
        self.until_epoch = min(until_epoch or cfg.epochs, cfg.epochs)
        self.budget_s, self.margin_s = budget_s, margin_s
        self.start_time = start_time or time.time()
        self.checkpointer = (ckpt.ShardedCheckpointer() if strategy.checkpointer_kind == "dcp"
                             else ckpt.FileCheckpointer())

    def log(self, msg: str) -> None:
        if self.s.is_main:
            print(msg, flush=True)

    # ---- set-up
    def build(self) -> None:
        cfg, s = self.cfg, self.s
        seed_everything(cfg.seed, cfg.deterministic)
        self.train_split = Split.load(self.data_dir, train=True)
        self.test_split = Split.load(self.data_dir, train=False)
        kw = dict(rank=s.rank, world_size=s.world_size, channels_last=cfg.channels_last,
                  device=s.device)
        if cfg.loader == "torchvision":
            self.batches = TorchvisionBatches(self.data_dir, self.train_split, cfg.batch_size,
                                              cfg.seed, num_workers=cfg.num_workers, **kw)
        else:
            self.batches = TensorBatches(self.train_split, cfg.batch_size, cfg.seed,
                                         pin_memory=str(s.device).startswith("cuda"), **kw)
        model = build_model(cfg.model).to(s.device)
        if cfg.channels_last and s.channels_last_params:
            model = model.to(memory_format=torch.channels_last)
        self.model = s.wrap(model)
        self.optimizer = build_optimizer(cfg, self.model.parameters())
        self.scheduler = build_scheduler(cfg, self.optimizer, len(self.batches))
        self.progress = Progress()

    # ---- checkpoints
    def state(self) -> dict:
        p = self.progress
        return {"model": self.s.model_state(self.model),
                "optimizer": self.s.optimizer_state(self.model, self.optimizer),
                "scheduler": self.scheduler.state_dict(), "rng": rng_state(),
                "progress": {k: getattr(p, k) for k in p.__dataclass_fields__},
                "config": self.cfg.to_dict()}

    def meta(self) -> dict:
        p = self.progress
        return {"run": self.cfg.run, "config_hash": self.cfg.shaping_hash(),
                "config": self.cfg.to_dict(), "epoch": p.epoch, "step": p.step,
                "epochs": self.cfg.epochs, "until_epoch": self.until_epoch,
                "done": p.epoch >= self.cfg.epochs, "segment_reached_target":
                p.epoch >= self.until_epoch, "world_size": self.s.world_size,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")}

    def save(self, directory: Path) -> float:
        t0 = time.perf_counter()
        self.checkpointer.save(directory, self.state(), self.meta(), self.s)
        return time.perf_counter() - t0

    def check_compatible(self, manifest: dict, directory: Path) -> None:
        if manifest["config_hash"] != self.cfg.shaping_hash():
            diff = self.cfg.shaping_diff(manifest.get("config", {}))
            changes = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in diff.items())
            raise ckpt.CheckpointError(
                f"refusing to resume from {directory}: the training config changed ({changes}). "
                "Only the segment count may change between segments; delete "
                f"results/runs/{self.cfg.strategy}/{self.cfg.run} to start this run afresh")

    def load(self, directory: Path) -> None:
        """directory comes from pick_resume, which has already checked its files."""
        self.check_compatible(ckpt.read_manifest(directory, verify=False), directory)
        if self.checkpointer.backend == "dcp":
            template = {"model": self.s.model_state(self.model),
                        "optimizer": self.s.optimizer_state(self.model, self.optimizer)}
            state, _ = self.checkpointer.load(directory, self.s, template, verify=False)
        else:
            state, _ = self.checkpointer.load(directory, self.s, verify=False)
        self.s.load_model_state(self.model, state["model"])
        self.s.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.progress = Progress(**state["progress"])

    def pick_resume(self) -> Path | None:
        """The previous segment's checkpoint, or this run's in-segment checkpoint when that
        got further (a killed job loses only the work since its last save)."""
        candidates = []
        for d in (self.resume_dir, self.work_dir):
            if d is None or not d.exists():
                continue
            if d == self.resume_dir:
                m = ckpt.read_manifest(d, verify=self.s.is_main)  # damaged input: an error
            else:
                try:
                    m = ckpt.read_manifest(d, verify=True)
                except ckpt.CheckpointError as exc:
                    self.log(f"ignoring unusable in-segment checkpoint: {exc}")
                    continue
                if m.get("config_hash") != self.cfg.shaping_hash():
                    continue
            pos = (m["epoch"], m["step"])
            if pos <= (self.until_epoch, 0):
                candidates.append((pos, d == self.resume_dir, d))
        if self.resume_dir is not None and not self.resume_dir.exists():
            raise ckpt.CheckpointError(f"previous segment checkpoint {self.resume_dir} is missing")
        return max(candidates)[2] if candidates else None

    # ---- training
    def train_step(self, x, y):
        with self.s.autocast():
            out = self.model(x)
            loss = F.cross_entropy(out, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return loss.detach(), (out.argmax(1) == y).sum()

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        correct = torch.zeros((), dtype=torch.float64, device=self.s.device)
        count = torch.zeros((), dtype=torch.float64, device=self.s.device)
        for x, y, valid in eval_batches(self.test_split, self.cfg.eval_batch_size, self.s.rank,
                                        self.s.world_size, self.cfg.channels_last, self.s.device):
            with self.s.autocast():
                pred = self.model(x).argmax(1)
            correct += ((pred == y) & valid).sum()
            count += valid.sum()
        self.model.train()
        totals = self.s.all_reduce(torch.stack([correct, count]).to(self.reduce_device()))
        return float(totals[0] / totals[1])

    def reduce_device(self):
        return self.s.device if getattr(self.s, "backend_name", "gloo") == "nccl" else "cpu"

    def end_epoch(self, images_per_sec_rank: float) -> dict:
        p, s = self.progress, self.s
        sums = s.all_reduce(torch.tensor([p.loss_sum, p.correct, p.seen, images_per_sec_rank],
                                         dtype=torch.float64, device=self.reduce_device()))
        t_eval = time.perf_counter()
        test_acc = self.evaluate()
        record = {"epoch": p.epoch + 1, "train_loss": float(sums[0] / sums[2]),
                  "train_acc": float(sums[1] / sums[2]), "test_acc": test_acc,
                  "images_per_sec": float(sums[3]), "images_per_sec_per_rank": images_per_sec_rank,
                  "wall_s": p.train_s, "eval_s": time.perf_counter() - t_eval,
                  "lr": self.scheduler.get_last_lr()[0], "world_size": s.world_size,
                  "peak_mem_mb": peak_memory_mb(s.device),
                  "gpu_util_pct": gpu_utilization(s.device),
                  "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")}
        p.history.append(record)
        p.epoch, p.step, p.loss_sum, p.correct, p.seen, p.train_s = p.epoch + 1, 0, 0.0, 0, 0, 0.0
        return record

    def run(self) -> dict:
        self.build()
        source = self.pick_resume()
        if source is not None:
            self.load(source)
            self.log(f"resumed from {source} at epoch {self.progress.epoch + 1}, "
                     f"batch {self.progress.step}")
        stop = StopController(self.budget_s, self.margin_s, self.s, self.start_time)
        p, steps = self.progress, len(self.batches)
        self.log(f"[{self.cfg.run}] {self.s.describe()} model={self.cfg.model} "
                 f"batch={self.cfg.batch_size} epochs {p.epoch + 1}..{self.until_epoch} "
                 f"of {self.cfg.epochs}, {steps} batches/epoch")
        reason, last_save, save_s = None, time.time(), 0.0
        while p.epoch < self.until_epoch and reason is None:
            # accumulators start from the checkpointed partial sums: same float sequence
            # whether or not the epoch was split
            loss_acc = torch.tensor(p.loss_sum, dtype=torch.float64, device=self.s.device)
            correct_acc = torch.tensor(p.correct, dtype=torch.int64, device=self.s.device)
            t0, t_log, done_here, base_s = time.perf_counter(), time.time(), 0, p.train_s
            seen_at_t0 = p.seen
            for x, y in self.batches.epoch(p.epoch, p.step):
                loss, correct = self.train_step(x, y)
                loss_acc += loss.double() * len(y)
                correct_acc += correct
                p.seen += len(y)
                p.step += 1
                done_here += 1
                elapsed = time.perf_counter() - t0
                if time.time() - t_log >= self.cfg.log_interval_s:
                    t_log = time.time()
                    self.log(f"  epoch {p.epoch + 1}/{self.cfg.epochs} batch {p.step}/{steps} "
                             f"loss {loss.item():.4f} "
                             f"{(p.seen - seen_at_t0) * self.s.world_size / elapsed:,.0f} img/s")
                if p.step >= steps:
                    break
                reason = stop.should_stop(elapsed / done_here + save_s)
                periodic = (self.work_dir is not None and
                            time.time() - last_save >= self.cfg.checkpoint_interval_s)
                if reason or periodic:
                    self._fold(loss_acc, correct_acc, base_s + time.perf_counter() - t0)
                    if reason:
                        break
                    save_s = self.save(self.work_dir)
                    last_save = time.time()
                    t0, done_here, base_s = time.perf_counter(), 0, p.train_s
                    seen_at_t0 = p.seen
            if reason:
                break
            self._fold(loss_acc, correct_acc, base_s + time.perf_counter() - t0)
            rec = self.end_epoch(p.seen / p.train_s if p.train_s else 0.0)
            self.log(f"epoch {rec['epoch']}/{self.cfg.epochs} loss {rec['train_loss']:.4f} "
                     f"train_acc {rec['train_acc']:.3f} test_acc {rec['test_acc']:.3f} "
                     f"{rec['images_per_sec']:,.0f} img/s ({rec['wall_s']:.1f} s)")
            if p.epoch < self.until_epoch:
                reason = stop.should_stop(rec["wall_s"] / max(1, steps) + save_s)
        if reason:
            self.log(f"stopping at epoch {p.epoch + 1} batch {p.step}: {reason}; checkpointing")
            if self.work_dir and reason.startswith("signal"):
                # Slurm may still mark the job failed (TIMEOUT) and Snakemake then drops
                # its outputs: the in-segment copy is what the rerun resumes from
                self.save(self.work_dir)
        save_s = self.save(self.out_dir)
        if self.s.is_main:
            write_metrics(self.out_dir / METRICS, p.history)
        self.log(f"checkpoint {self.out_dir} written in {save_s:.2f} s "
                 f"({'done' if p.epoch >= self.cfg.epochs else 'to be continued'})")
        return {"epoch": p.epoch, "step": p.step, "stopped": reason, "save_s": save_s}

    def _fold(self, loss_acc, correct_acc, train_s) -> None:
        """Copy the device-side accumulators into the (checkpointed) progress record."""
        p = self.progress
        p.loss_sum, p.correct, p.train_s = float(loss_acc), int(correct_acc), train_s


def write_metrics(path: Path, history: list) -> None:
    ckpt.atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in history))


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def run_training(cfg: TrainConfig, **kw) -> dict:
    """Thin entry point: build the strategy, train, always tear the process group down."""
    from .strategies import get_strategy

    strategy = get_strategy(cfg.strategy)(cfg)
    try:
        strategy.setup()
        if hasattr(strategy, "fit"):  # strategies that bring their own loop (Lightning)
            return strategy.fit(kw)
        return Trainer(cfg, strategy, **kw).run()
    finally:
        strategy.teardown()
        sys.stdout.flush()
