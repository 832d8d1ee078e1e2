"""The one training loop, and the pieces every strategy's loop is made of.

A ``Segment`` trains a run from its last checkpoint up to ``until_epoch``, or until its
time budget or a SIGUSR2/SIGTERM says stop (at a batch boundary), then publishes a
checkpoint with the metric history inside it. Trained in K segments or one, the weights
are bit-identical: the checkpoint holds model, optimizer, scheduler, RNG states, the
position inside the epoch and the partial-epoch accumulators, and the data order is a
pure function of (seed, epoch).

``Segment.run`` is the engine's own loop. A framework that brings its own loop
(Lightning) calls the same pieces from its hooks: ``resume``, ``begin``, ``after_batch``,
``end_epoch``, ``finish``. Every decision that leads to a collective (stop, save, which
checkpoint to resume) is one value agreed by all ranks.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import checkpoint as ckpt
from . import stop_signals
from .config import TrainConfig
from .gpu_monitor import GpuSampler, nvml_reader
from .loaders import Split, TensorBatches, TorchvisionBatches, eval_batches
from .models import build_model

METRICS = ckpt.METRICS
# TensorBoard tag -> metrics.jsonl field, written at every epoch's end
EPOCH_SCALARS = {"train/loss_epoch": "train_loss", "train/acc": "train_acc",
                 "test/acc": "test_acc", "lr": "lr", "throughput/images_per_sec": "images_per_sec"}


# ---- building blocks -------------------------------------------------------------------

def seed_everything(seed: int, deterministic: bool, compiled: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic and compiled:
        torch.use_deterministic_algorithms(True, warn_only=True)
    elif deterministic:
        # what the public call does minus importing torch._inductor (1.3 s of start-up),
        # which only torch.compile reads
        torch._C._set_deterministic_algorithms(True, warn_only=True)


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


def peak_memory_mb(device: str) -> float:
    if str(device).startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ---- agreed decisions ------------------------------------------------------------------

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
    """Whether to stop or save at this batch boundary: one value for all ranks.

    The Slurm executor forwards no warning signal and counts TIMEOUT as failure, so a
    segment times itself: it stops at min(0.8 T, T - margin) of its budget T, leaving room
    for the final checkpoint; SIGUSR2/SIGTERM are the backstop. Each rank contributes its
    signal and deadline, rank 0 its save clock; one all-reduce (max) of the two flags makes
    every rank stop or save at the same batch."""

    def __init__(self, budget_s: float | None, margin_s: float, strategy, start: float,
                 interval_s: float):
        self.s, self.interval_s = strategy, interval_s
        deadlines = []
        if budget_s:
            deadlines.append(start + min(0.8 * budget_s, budget_s - margin_s))
        end = slurm_end_time()
        if end:
            remaining = end - start
            deadlines.append(start + min(0.8 * remaining, remaining - margin_s))
        self.deadline = min(deadlines) if deadlines else math.inf
        self.last_save = time.time()
        stop_signals.listen()

    @property
    def signalled(self) -> str | None:
        return stop_signals.received

    def decide(self, next_step_s: float, may_save: bool) -> tuple[str | None, bool]:
        """(stop reason or None, save now?) agreed by all ranks."""
        now = time.time()
        stop = 2 + self.s.rank if self.signalled else int(now + next_step_s > self.deadline)
        save = int(may_save and self.s.is_main and now - self.last_save >= self.interval_s)
        if self.s.world_size > 1:
            flags = self.s.all_reduce(torch.tensor([stop, save], device=self.s.reduce_device), "max")
            stop, save = int(flags[0]), int(flags[1])
        if stop >= 2:
            local = self.signalled and stop == 2 + self.s.rank
            return (f"signal {self.signalled}" if local else f"signal on rank {stop - 2}"), False
        return ("time budget" if stop else None), bool(save)

    def saved(self) -> None:
        self.last_save = time.time()


# ---- one segment -----------------------------------------------------------------------

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


def slurm_restarts() -> int:
    """How often Slurm requeued this job (the workflow passes it on past the jobstep)."""
    return int(os.environ.get("SLURM_RESTART_COUNT")
               or os.environ.get("CIFARFLOW_SLURM_RESTART_COUNT") or 0)


class MidEpochResize(ckpt.CheckpointError):
    """An elastic run met a checkpoint of another world size taken inside an epoch."""


class Segment:
    def __init__(self, cfg: TrainConfig, strategy, data_dir: Path, out_dir: Path,
                 resume_dir: Path | None = None, work_dir: Path | None = None,
                 until_epoch: int | None = None, budget_min: float | None = None,
                 start_time: float | None = None, attempt: int = 1,
                 tensorboard_dir: Path | None = None):
        self.cfg, self.s = cfg, strategy
        self.data_dir, self.out_dir = Path(data_dir), Path(out_dir)
        self.resume_dir = Path(resume_dir) if resume_dir else None
        self.work_dir = Path(work_dir) if work_dir else None
        self.until_epoch = min(until_epoch or cfg.epochs, cfg.epochs)
        budgets = [b for b in (cfg.budget_s, (budget_min or 0) * 60) if b]
        self.budget_s = min(budgets) if budgets else None
        self.start_time, self.attempt = start_time or time.time(), attempt
        self.checkpointer = strategy.checkpointer()
        self.progress = Progress()
        self.stop: StopController | None = None
        self.resized_from: int | None = None  # rank 0: world size of the chosen checkpoint
        self.gpu: GpuSampler | None = None  # utilisation samples while training on a GPU
        self.tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir else None
        self.board = None  # rank 0's TensorBoard writer, when tensorboard_dir is set

    def log(self, msg: str) -> None:
        if self.s.is_main:
            print(msg, flush=True)

    # ---- pieces a loop is built from
    def load_data(self) -> None:
        seed_everything(self.cfg.seed, self.cfg.deterministic, self.cfg.compile)
        self.train_split = Split.load(self.data_dir, train=True)
        self.test_split = Split.load(self.data_dir, train=False)

    def make_batches(self):
        cfg, s = self.cfg, self.s
        kw = dict(rank=s.rank, world_size=s.world_size, channels_last=cfg.channels_last,
                  device=s.device)
        self.test_split = self.test_split.to(s.device)  # evaluation gathers on the device
        if cfg.loader == "torchvision":
            return TorchvisionBatches(self.data_dir, self.train_split, cfg.batch_size, cfg.seed,
                                      num_workers=cfg.num_workers, **kw)
        return TensorBatches(self.train_split, cfg.batch_size, cfg.seed, **kw)

    def make_model(self):
        model = build_model(self.cfg.model, self.cfg.model_args).to(self.s.device)
        if self.cfg.channels_last and self.s.channels_last_params:
            model = model.to(memory_format=torch.channels_last)
        return model

    def make_optimizer(self, params, steps_per_epoch: int):
        optimizer = build_optimizer(self.cfg, params)
        return optimizer, build_scheduler(self.cfg, optimizer, steps_per_epoch)

    def attach(self, model, optimizer, scheduler, batches) -> None:
        """What the loop trains: model as called (wrapped), its optimizer and schedule."""
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.batches, self.steps = batches, len(batches)

    # ---- checkpoints
    def state(self) -> dict:
        """Called by every rank at an agreed save: the partial sums of all ranks are
        gathered (exactly: each row is one rank's, the others add zeros)."""
        p = self.progress
        rows = torch.zeros(self.s.world_size, 4, dtype=torch.float64, device=self.s.reduce_device)
        rows[self.s.rank] = torch.tensor([p.loss_sum, p.correct, p.seen, p.train_s],
                                         dtype=torch.float64)
        p.ranks = self.s.all_reduce(rows).tolist()
        return {"model": self.s.model_state(self.model),
                "optimizer": self.s.optimizer_state(self.model, self.optimizer),
                "trainer": {"scheduler": self.scheduler.state_dict(), "rng": rng_state(),
                            "progress": {k: getattr(p, k) for k in p.__dataclass_fields__},
                            "config": self.cfg.to_dict()}}

    def meta(self) -> dict:
        p = self.progress
        return {"run": self.cfg.run, "config_hash": self.cfg.shaping_hash(),
                "config": self.cfg.to_dict(), "epoch": p.epoch, "step": p.step,
                "epochs": self.cfg.epochs, "until_epoch": self.until_epoch,
                "done": p.epoch >= self.cfg.epochs, "segment_reached_target":
                p.epoch >= self.until_epoch, "world_size": self.s.world_size,
                "events": p.events, "segment_runs": p.segment_runs, "resizes": p.resizes,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")}

    def save(self, directory: Path) -> float:
        t0 = time.perf_counter()
        self.s.sync_buffers(self.model)
        history = "".join(json.dumps(r) + "\n" for r in self.progress.history)
        self.checkpointer.save(directory, self.state(), self.meta(), {METRICS: history})
        return time.perf_counter() - t0

    def check_compatible(self, manifest: dict, directory: Path, what: str) -> int | None:
        """None if the checkpoint's config is this one; the checkpoint's world size if only
        that changed and the run is elastic; else a CheckpointError."""
        if manifest.get("config_hash") == self.cfg.shaping_hash():
            return None
        diff = self.cfg.shaping_diff(manifest.get("config", {}))
        if set(diff) == {"world_size"} and self.cfg.elastic:
            if manifest["step"]:
                raise MidEpochResize(
                    f"{directory} stopped inside epoch {manifest['epoch'] + 1}: a run changes "
                    f"world size ({diff['world_size'][0]} -> {self.cfg.world_size}) at an "
                    "epoch boundary only; finish that epoch on the old world size first")
            return diff["world_size"][0]
        changes = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in diff.items())
        hint = ("; or set segments.elastic: true to go on with the new world size (the run is "
                "then no longer bit-exact)" if set(diff) == {"world_size"} else "")
        raise ckpt.CheckpointError(
            f"refusing to resume from {directory}: the training config changed ({changes}). "
            f"Restore the config, or delete {what} to train this run afresh{hint}")

    def _pick(self) -> tuple[Path | None, list[str]]:
        """Rank 0: the furthest usable checkpoint of this run, and what was set aside."""
        found, notes = [], []
        run_dir = self.out_dir.parent
        if self.resume_dir is not None:
            if not self.resume_dir.exists():
                raise ckpt.CheckpointError(f"previous segment checkpoint {self.resume_dir} is "
                                           "missing; rerun snakemake to retrain it")
            m = ckpt.read_manifest(self.resume_dir)
            resized = self.check_compatible(m, self.resume_dir, run_dir)
            found.append(((m["epoch"], m["step"]), 1, self.resume_dir, resized))
        if self.work_dir is not None and self.work_dir.exists():
            try:
                m = ckpt.read_manifest(self.work_dir)
            except ckpt.CheckpointError as exc:
                notes.append(f"in-segment checkpoint unusable ({exc}); fell back to "
                             f"{self.resume_dir or 'the start of the run'}")
            else:
                try:
                    resized = self.check_compatible(m, self.work_dir, self.work_dir)
                except MidEpochResize as exc:
                    notes.append(f"in-segment checkpoint set aside ({exc}); fell back to "
                                 f"{self.resume_dir or 'the start of the run'}")
                else:
                    found.append(((m["epoch"], m["step"]), 0, self.work_dir, resized))
        if not found:
            return None, notes
        pos, _, chosen, self.resized_from = max(found)
        if pos > (self.until_epoch, 0):
            notes.append(f"{chosen} is at epoch {pos[0] + 1} batch {pos[1]}, past this "
                         f"segment's target epoch {self.until_epoch} (segments.count changed?): "
                         "nothing to train, published as is")
        return chosen, notes

    def resume(self) -> Path | None:
        """Load the checkpoint rank 0 chose; every rank learns the choice (or the error)."""
        self.places = self.s.gather_objects((socket.gethostname(), sys.prefix))  # per rank
        self.hosts = [host for host, _ in self.places]
        choice, error, notes, code, resized = None, None, [], 0, 0
        if self.s.is_main:
            try:
                choice, notes = self._pick()
                code = 0 if choice is None else (1 if choice == self.resume_dir else 2)
                resized = (self.resized_from or 0) if choice is not None else 0
            except ckpt.CheckpointError as exc:
                error, code = exc, -1
        if self.s.world_size > 1:
            code, resized = (int(v) for v in self.s.all_reduce(
                torch.tensor([code, resized], device=self.s.reduce_device)))
            choice = {0: None, 1: self.resume_dir, 2: self.work_dir, -1: None}[code]
        if code == -1:
            raise error or ckpt.CheckpointError("rank 0 refused the checkpoint (see its message)")
        for note in notes:
            self.log(f"WARNING: {note}")
        if choice is not None:
            template = {"model": self.s.model_state(self.model),
                        "optimizer": self.s.optimizer_state(self.model, self.optimizer)}
            state = self.checkpointer.load(choice, template)
            self.s.load_model_state(self.model, state["model"])
            self.s.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
            trainer = state["trainer"]
            set_rng_state(trainer["rng"])
            self.progress = p = Progress(**trainer["progress"])
            if resized:
                self._resize(resized)
            else:
                self.scheduler.load_state_dict(trainer["scheduler"])
                loss_sum, correct, seen, p.train_s = p.ranks[self.s.rank]  # this rank's share
                p.loss_sum, p.correct, p.seen = loss_sum, int(correct), int(seen)
            self.log(f"resumed from {choice} at epoch {self.progress.epoch + 1}, "
                     f"batch {self.progress.step}")
        self.progress.events += notes
        return choice

    def _resize(self, old_world: int) -> None:
        """Go on with another world size from an epoch boundary: the schedule is replayed
        for this world's batches per epoch, and the per-rank sums (all zero there) start
        anew for its ranks."""
        p = self.progress
        with warnings.catch_warnings():  # stepping a schedule without optimizer steps
            warnings.simplefilter("ignore")
            for _ in range(p.epoch * self.steps):
                self.scheduler.step()
        p.ranks = [[0.0, 0, 0, 0.0] for _ in range(self.s.world_size)]
        p.resizes.append({"epoch": p.epoch, "from": old_world, "to": self.s.world_size})
        self.log(f"elastic resume: world size {old_world} -> {self.s.world_size} at epoch "
                 f"{p.epoch + 1}; from here on the run is no longer bit-exact")

    # ---- the loop's steps
    def begin(self) -> None:
        p = self.progress
        self.stop = StopController(self.budget_s, self.cfg.margin_s, self.s, self.start_time,
                                   self.cfg.checkpoint_interval_s)
        self.save_s = 0.0
        self.gpu = self._gpu_sampler()
        self.board = self._board()
        self.log(f"[{self.cfg.run}] {self.s.describe()} model={self.cfg.model} "
                 f"batch={self.cfg.batch_size} epochs {p.epoch + 1}..{self.until_epoch} "
                 f"of {self.cfg.epochs}, {self.steps} batches/epoch")
        self.log("ranks: " + ", ".join(f"{r} on {host} (python {prefix})"
                                       for r, (host, prefix) in enumerate(self.places)))

    def _gpu_sampler(self) -> GpuSampler | None:
        if not str(self.s.device).startswith("cuda"):
            return None
        read, why = nvml_reader(self.s.device)
        if read is None:
            self.log(f"GPU utilisation not sampled ({why}): pip install nvidia-ml-py")
            return None
        return GpuSampler(read).start()

    def _board(self):
        """Steps are batches since the start of the run, so segments draw one curve. Steps
        past this resume point, left by a killed try, are hidden: TensorBoard drops the
        earlier files' events from purge_step on."""
        if not (self.tensorboard_dir and self.s.is_main):
            return None
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.tensorboard_dir), purge_step=self.global_step() + 1)

    def global_step(self) -> int:
        return self.progress.epoch * self.steps + self.progress.step

    def start_epoch(self) -> None:
        """Accumulators start from the checkpointed partial sums: the same float sequence
        whether or not the epoch was split."""
        p = self.progress
        self._loss = torch.tensor(p.loss_sum, dtype=torch.float64, device=self.s.device)
        self._hits = torch.tensor(p.correct, dtype=torch.int64, device=self.s.device)
        self._restart_clock()
        self._t_log = time.time()
        if self.gpu:
            self.gpu.take()  # this epoch's training only

    def _restart_clock(self) -> None:
        self._mark, self._base_s, self._seen0, self._steps0 = (
            time.perf_counter(), self.progress.train_s, self.progress.seen, 0)

    def _fold(self) -> None:
        """Copy the device-side accumulators into the (checkpointed) progress record."""
        p = self.progress
        p.loss_sum, p.correct = float(self._loss), int(self._hits)
        p.train_s = self._base_s + time.perf_counter() - self._mark

    def compute(self, x, y):
        """Loss and correct predictions of one batch (the forward pass every loop uses)."""
        with self.s.autocast():
            out = self.model(x)
            return F.cross_entropy(out, y), (out.argmax(1) == y).sum()

    def train_step(self, x, y):
        loss, hits = self.compute(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return loss.detach(), hits

    def after_batch(self, loss, hits, n: int) -> str | None:
        """Account one trained batch; inside an epoch, stop or save when all ranks agree."""
        p = self.progress
        self._loss += loss.double() * n
        self._hits += hits
        p.seen += n
        p.step += 1
        self._steps0 += 1
        elapsed = time.perf_counter() - self._mark
        log_now = time.time() - self._t_log >= self.cfg.log_interval_s
        if log_now:
            self._t_log = time.time()
            self.log(f"  epoch {p.epoch + 1}/{self.cfg.epochs} batch {p.step}/{self.steps} "
                     f"loss {loss.item():.4f} "
                     f"{(p.seen - self._seen0) * self.s.world_size / elapsed:,.0f} img/s")
        if self.board and (log_now or p.step >= self.steps):
            self.board.add_scalar("train/loss", loss.item(), self.global_step())
        if p.step >= self.steps:
            return None  # the epoch's end decides
        return self._decide(elapsed / self._steps0 + self.save_s)

    def _decide(self, next_step_s: float) -> str | None:
        reason, save = self.stop.decide(next_step_s, may_save=self.work_dir is not None)
        if reason or save:
            self._fold()
        if save:
            self.save_s = self.save(self.work_dir)
            self.stop.saved()
            if self.board:
                self.board.flush()  # a killed try's curve reaches the point it resumes from
            self._restart_clock()
        return reason

    @torch.no_grad()
    def evaluate(self) -> float:
        self.s.sync_buffers(self.model)
        self.model.eval()
        hits = torch.zeros(2, dtype=torch.float64, device=self.s.device)
        for x, y, valid in eval_batches(self.test_split, self.cfg.eval_batch_size, self.s.rank,
                                        self.s.world_size, self.cfg.channels_last, self.s.device):
            with self.s.autocast():
                pred = self.model(x).argmax(1)
            hits += torch.stack([((pred == y) & valid).sum(), valid.sum()]).double()
        self.model.train()
        totals = self.s.all_reduce(hits.to(self.s.reduce_device))
        return float(totals[0] / totals[1])

    def end_epoch(self) -> str | None:
        """Record the finished epoch (reduced over ranks, evaluated); then, if more epochs
        follow in this segment, stop or save when all ranks agree."""
        self._fold()
        p, s = self.progress, self.s
        ips_rank = p.seen / p.train_s if p.train_s else 0.0
        sums = s.all_reduce(torch.tensor([p.loss_sum, p.correct, p.seen, ips_rank],
                                         dtype=torch.float64, device=s.reduce_device))
        gpu = self.gpu.take() if self.gpu else {"gpu_util_pct": None, "gpu_mem_mb": None}
        t_eval = time.perf_counter()
        test_acc = self.evaluate()
        rec = {"epoch": p.epoch + 1, "train_loss": float(sums[0] / sums[2]),
               "train_acc": float(sums[1] / sums[2]), "test_acc": test_acc,
               "images_per_sec": float(sums[3]), "images_per_sec_per_rank": ips_rank,
               "wall_s": p.train_s, "eval_s": time.perf_counter() - t_eval,
               "lr": self.scheduler.get_last_lr()[0], "world_size": s.world_size,
               "peak_mem_mb": peak_memory_mb(s.device), "gpu_util_pct": gpu["gpu_util_pct"],
               "gpu_mem_mb": gpu["gpu_mem_mb"],
               "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""), "hosts": self.hosts}
        p.history.append(rec)
        p.epoch, p.step, p.loss_sum, p.correct, p.seen, p.train_s = p.epoch + 1, 0, 0.0, 0, 0, 0.0
        if self.board:
            for tag, key in EPOCH_SCALARS.items():
                self.board.add_scalar(tag, rec[key], self.global_step())
        self.log(f"epoch {rec['epoch']}/{self.cfg.epochs} loss {rec['train_loss']:.4f} "
                 f"train_acc {rec['train_acc']:.3f} test_acc {rec['test_acc']:.3f} "
                 f"{rec['images_per_sec']:,.0f} img/s ({rec['wall_s']:.1f} s)")
        if p.epoch >= self.until_epoch:
            return None
        self.start_epoch()
        return self._decide(rec["wall_s"] / max(1, self.steps) + self.save_s)

    def finish(self, reason: str | None) -> dict:
        p = self.progress
        if self.gpu:
            self.gpu.stop()
        if self.board:
            self.board.close()
        p.segment_runs.append({"segment": self.out_dir.name, "attempt": self.attempt,
                               "stopped": reason, "epoch": p.epoch, "step": p.step,
                               "requeue": slurm_restarts(), "hosts": self.hosts,
                               "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")})
        if reason:
            # every rank says where it stopped, in one write so lines do not interleave
            sys.stdout.write(f"[rank {self.s.rank}] stopping at epoch {p.epoch + 1} "
                             f"batch {p.step}: {reason}\n")
            sys.stdout.flush()
            if self.work_dir and reason.startswith("signal"):
                # Slurm may still mark the job failed (TIMEOUT) and Snakemake then drops
                # its outputs: the in-segment copy is what the rerun resumes from
                self.save(self.work_dir)
        save_s = self.save(self.out_dir)
        self.log(f"checkpoint {self.out_dir} written in {save_s:.2f} s "
                 f"({'done' if p.epoch >= self.cfg.epochs else 'to be continued'})")
        return {"epoch": p.epoch, "step": p.step, "stopped": reason, "save_s": save_s}

    # ---- the engine's own loop
    def run(self) -> dict:
        self.load_data()
        batches = self.make_batches()
        model = self.s.wrap(self.make_model())
        self.attach(model, *self.make_optimizer(model.parameters(), len(batches)), batches)
        self.resume()
        self.begin()
        p, reason = self.progress, None
        while reason is None and p.epoch < self.until_epoch:
            self.start_epoch()
            for x, y in self.batches.epoch(p.epoch, p.step):
                reason = self.after_batch(*self.train_step(x, y), len(y))
                if reason:
                    break
            else:
                reason = self.end_epoch()
        return self.finish(reason)


def run_training(cfg: TrainConfig, threads: int = 0, **segment_kw) -> dict:
    """Thin entry point: set the strategy up, let it drive a segment, always tear down."""
    from .strategies import get_strategy

    strategy = get_strategy(cfg.strategy)(cfg, threads)
    try:
        strategy.setup()
        return strategy.train(Segment(cfg, strategy, **segment_kw))
    finally:
        strategy.teardown()
        sys.stdout.flush()
