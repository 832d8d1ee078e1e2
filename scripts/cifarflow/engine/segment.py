"""One run's ledger: what a segment of a run knows (its config, order, paths, progress,
records, report) and the pieces its training is built from. engine/loop.py trains it;
its checkpoints are checkpoints/run.py's, given what they need."""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from pathlib import Path

import torch

from . import self_stop, start_barrier
from ..config import TrainConfig
from ..orders import SegmentOrder
from .build import (build_batches, build_optimizer, build_placed_model, build_scheduler,
                    seed_everything)
from .checkpoints.run import RunCheckpoints, Trained
from .loaders import Split
from .report import Reporter
from .stage import stage_split
from .state import Progress, slurm_restarts
from .usage import peak_memory_mb, rank_usage, segment_usage


class Segment:
    """A run from its last checkpoint up to ``until_epoch``: what it knows and records.
    The loop (engine/loop.py) drives it, alone or as one member of a fused group; only
    the segment writes its fields."""

    def __init__(self, cfg: TrainConfig, strategy, order: SegmentOrder,
                 start_time: float | None = None, stream=None, sample_gpu: bool = True):
        """Segment ``order`` (orders.SegmentOrder: where it reads and writes, its target
        epoch, what its try's job got) of the run ``cfg``, under ``strategy``; its lines go
        to ``stream`` (stdout when None); ``sample_gpu``: whether its report samples the
        GPU (a fused group samples it once, for all its members)."""
        self.cfg, self.strategy, self.order = cfg, strategy, order
        self.data_dir = Path(order.data)
        self.until_epoch = min(order.until_epoch or cfg.epochs, cfg.epochs)
        budgets = [b for b in (cfg.budget_s, (order.budget_min or 0) * 60) if b]
        self.budget_s = min(budgets) if budgets else None
        self.start_time, self.attempt = start_time or time.time(), order.attempt
        self.requested = {"requested_mem_mb": order.mem_mb,
                          "requested_runtime_min": order.budget_min}
        self.progress = Progress()
        self.stopping = cfg.stopping()  # train.early_stop, decided from progress.history
        self.report = Reporter(strategy, order.tensorboard if cfg.tensorboard else None,
                               stream, sample_gpu)
        self.checkpoints = RunCheckpoints(cfg, strategy, order, self.until_epoch, self.log)
        self.train_split = self.test_split = None
        self.model = self.optimizer = self.scheduler = self.batches = None
        self.steps = 0            # batches per epoch
        self.places: list = []    # (host, python prefix) of every rank
        self.hosts: list = []
        self.diverged = ""        # why a fused member's run ended: its loss is not finite

    @property
    def work_dir(self) -> Path | None:
        return self.checkpoints.work_dir

    def log(self, msg: str) -> None:
        self.report.log(msg)

    # ---- what its training is built from
    def load_data(self, like: Segment | None = None, on_device: bool = False) -> None:
        """The splits, node-local where asked (or ``like``'s: a fused group's members read
        one copy); ``on_device``: the training split too (a fused group's one copy)."""
        if like is not None:
            self.data_dir, self.train_split = like.data_dir, like.train_split
            self.test_split = like.test_split
            return
        seed_everything(self.cfg.seed, self.cfg.deterministic, self.cfg.compile)
        self.data_dir = stage_split(self.data_dir, self.order.stage_data)
        self.train_split = Split.load(self.data_dir, train=True)
        self.test_split = Split.load(self.data_dir, train=False)
        if on_device:
            self.train_split = self.train_split.to(self.strategy.device)

    def make_batches(self):
        self.test_split = self.test_split.to(self.strategy.device)  # evaluation on the device
        return build_batches(self.cfg, self.strategy, self.data_dir, self.train_split)

    def make_model(self):
        return build_placed_model(self.cfg, self.strategy)

    def make_optimizer(self, params, steps_per_epoch: int):
        optimizer = build_optimizer(self.cfg, params)
        return optimizer, build_scheduler(self.cfg, optimizer, steps_per_epoch)

    def attach(self, model, optimizer, scheduler, batches) -> None:
        """What the loop trains: model as called (wrapped), its optimizer and schedule."""
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.batches, self.steps = batches, len(batches)

    def build(self) -> None:
        """Data, batches, the model as the strategy wraps it, its optimizer and schedule."""
        self.load_data()
        batches = self.make_batches()
        model = self.strategy.wrap(self.make_model())
        self.attach(model, *self.make_optimizer(model.parameters(), len(batches)), batches)

    def trained(self) -> Trained:
        return Trained(self.model, self.optimizer, self.scheduler)

    # ---- where it stands
    def global_step(self) -> int:
        return self.progress.epoch * self.steps + self.progress.step

    def stopped_early(self) -> str:
        """Why this run ended before its last epoch ('' if it did not): a fused member that
        diverged, or train.early_stop, decided from the epoch records the checkpoint
        carries, so K segments decide as one does."""
        if self.diverged:
            return self.diverged
        if self.progress.epoch >= self.cfg.epochs:
            return ""  # it trained all its epochs
        return self.stopping.stop_reason(self.progress.history)

    def done(self) -> bool:
        return self.progress.epoch >= self.cfg.epochs or bool(self.stopped_early())

    def epochs_left(self) -> int:
        """Epochs this segment trains (a partial one counts); none once the run is done."""
        return 0 if self.stopped_early() else max(0, self.until_epoch - self.progress.epoch)

    # ---- its records
    def begin(self) -> None:
        """The report opens; the segment says what it trains, on which ranks."""
        p = self.progress
        self.report.open(self.global_step())
        self.log(f"[{self.cfg.run}] {self.strategy.describe()} model={self.cfg.model} "
                 f"batch={self.cfg.batch_size} epochs {p.epoch + 1}..{self.until_epoch} "
                 f"of {self.cfg.epochs}, {self.steps} batches/epoch")
        self.log("ranks: " + ", ".join(f"{r} on {host} (python {prefix})"
                                       for r, (host, prefix) in enumerate(self.places)))
        mem, runtime = self.requested.values()
        if mem or runtime:
            self.log(f"request: {f'{mem} MB per node' if mem else 'memory unknown'}, "
                     f"{f'{runtime:g} min' if runtime else 'no time limit'}")
        if self.stopped_early():
            self.log(f"the run ended at epoch {p.epoch} ({self.stopped_early()}): "
                     "nothing to train, its checkpoint is published as is")
        self_stop.stop_at(self_stop.BEFORE_FIRST_BATCH, self.out_dir)  # tests only
        start_barrier.wait(self.log)  # benchmarks only: runs side by side start together

    @property
    def out_dir(self) -> Path:
        return self.checkpoints.out_dir

    def reduced_sums(self):
        """The finished epoch's loss, hits, images and images/s summed over the ranks."""
        p, s = self.progress, self.strategy
        ips_rank = p.seen / p.train_s if p.train_s else 0.0
        return s.all_reduce(torch.tensor([p.loss_sum, p.correct, p.seen, ips_rank],
                                         dtype=torch.float64, device=s.reduce_device))

    def close_epoch(self, sums, accs: dict, eval_s: float, gpu: dict,
                    window: tuple) -> dict:
        """The finished epoch's record (``sums``: reduced_sums; ``accs``: test_acc, and
        test_acc_tta; ``gpu``: the GPU's use; ``window``: the epoch's training window, the
        meter's started_at and ended_at) into the history, the log and TensorBoard; the
        next epoch begins."""
        p, s = self.progress, self.strategy
        rec = {"epoch": p.epoch + 1, "train_loss": float(sums[0] / sums[2]),
               "train_acc": float(sums[1] / sums[2]), "test_acc": accs["test_acc"],
               "images_per_sec": float(sums[3]),
               "images_per_sec_per_rank": p.seen / p.train_s if p.train_s else 0.0,
               "wall_s": p.train_s, "eval_s": eval_s,
               # this process's training window (wall clock, s since the epoch; the start
               # of the epoch or of this process's part of it): runs side by side line up
               "started_at": window[0], "ended_at": window[1],
               "lr": self.scheduler.get_last_lr()[0], "world_size": s.world_size,
               "peak_mem_mb": peak_memory_mb(s.device), "gpu_util_pct": gpu["gpu_util_pct"],
               "gpu_mem_mb": gpu["gpu_mem_mb"], "amp": s.amp,
               "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""), "hosts": self.hosts}
        if "test_acc_tta" in accs:  # eval.tta: flip
            rec["test_acc_tta"] = accs["test_acc_tta"]
        p.history.append(rec)
        p.next_epoch()
        self.report.epoch(rec, self.global_step(), self.cfg.epochs)
        flat = self.stopping.newly_flat(p.history)
        if flat:
            self.log(flat)
        if self.stopped_early():
            self.log(f"{self.stopped_early()}: the run ends at epoch {p.epoch} of "
                     f"{self.cfg.epochs} (train.early_stop)")
        return rec

    def check_finite(self) -> None:
        """A fused member whose last epoch's loss is not finite ends its run here."""
        loss = self.progress.history[-1]["train_loss"]
        if not math.isfinite(loss):
            self.diverged = f"diverged: train loss {loss} in epoch {self.progress.epoch}"
            self.log(f"WARNING: {self.diverged}; the run ends here (the other members of "
                     "its fused group go on)")

    # ---- its checkpoints
    def save(self, directory: Path) -> float:
        return self.checkpoints.save(directory, self.trained(), self.progress, self.done(),
                                     self.stopped_early())

    def resume(self) -> None:
        """Where every rank runs, then the checkpoint all ranks agreed on, if any."""
        self.places = self.strategy.gather_objects((socket.gethostname(), sys.prefix))
        self.hosts = [host for host, _ in self.places]
        progress, notes = self.checkpoints.resume(self.trained(), self.steps)
        self.progress = progress or self.progress
        self.progress.events += notes

    def finish(self, reason: str | None) -> dict:
        """The segment's end: what it used, where it stopped, its checkpoint published."""
        p = self.progress
        self.report.close()
        ranks = self.strategy.gather_objects(rank_usage())  # every rank, one collective
        used = segment_usage(ranks, time.time() - self.start_time, self.strategy.threads(),
                             reason)
        p.segment_runs.append({"segment": self.out_dir.name, "attempt": self.attempt,
                               "stopped": reason, "epoch": p.epoch, "step": p.step,
                               "requeue": slurm_restarts(), "hosts": self.hosts,
                               "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
                               **self.requested, **used})
        if reason:
            # every rank says where it stopped, in one write so lines do not interleave
            self.report.say(f"[rank {self.strategy.rank}] stopping at epoch {p.epoch + 1} "
                            f"batch {p.step}: {reason}")
        save_s = self.checkpoints.publish(self.trained(), p, self.done(), self.stopped_early(),
                                          reason)
        return {"epoch": p.epoch, "step": p.step, "stopped": reason, "save_s": save_s,
                "done": self.done()}
