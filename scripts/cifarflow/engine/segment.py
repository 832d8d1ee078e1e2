"""One segment of a run: the engine's loop, and the hooks a framework's loop calls."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import self_stop, start_barrier
from ..config import TrainConfig
from ..orders import SegmentOrder
from .evaluation import evaluate
from .loaders import Split
from .stage import stage_split
from .build import (build_batches, build_optimizer, build_placed_model, build_scheduler,
                    seed_everything)
from .meter import EpochMeter
from .report import Reporter
from .state import Progress
from .checkpoints.run import EARLY_STOP, SegmentCheckpoints
from .stop import StopController
from .usage import peak_memory_mb


class Segment(SegmentCheckpoints):
    """Trains a run from its last checkpoint up to ``until_epoch``, or until its time
    budget or a signal says stop (at a batch boundary), then publishes a checkpoint.

    ``run`` is the engine's own loop. A framework that brings its own (Lightning) calls
    the same hooks: ``load_data``, ``make_batches``, ``make_model``, ``make_optimizer``,
    ``attach``, ``resume``, ``begin``, ``start_epoch``, ``compute``, ``after_batch``,
    ``end_epoch``, ``finish``."""

    def __init__(self, cfg: TrainConfig, strategy, order: SegmentOrder,
                 start_time: float | None = None):
        """Segment ``order`` (orders.SegmentOrder: where it reads and writes, its target
        epoch, what its try's job got) of the run ``cfg``, under ``strategy``."""
        self.cfg, self.strategy, self.order = cfg, strategy, order
        self.data_dir, self.out_dir = Path(order.data), Path(order.out)
        self.resume_dir = Path(order.resume) if order.resume else None
        self.work_dir = Path(order.work) if order.work else None
        self.until_epoch = min(order.until_epoch or cfg.epochs, cfg.epochs)
        budgets = [b for b in (cfg.budget_s, (order.budget_min or 0) * 60) if b]
        self.budget_s = min(budgets) if budgets else None
        self.start_time, self.attempt = start_time or time.time(), order.attempt
        self.stage = order.stage_data  # data.stage: where load_data reads the split from
        self.requested = {"requested_mem_mb": order.mem_mb,
                          "requested_runtime_min": order.budget_min}
        self.checkpointer = strategy.checkpointer()
        self.progress = Progress()
        self.stopping = cfg.stopping()  # train.early_stop, decided from progress.history
        self.report = Reporter(strategy, order.tensorboard if cfg.tensorboard else None)
        self.meter = EpochMeter(strategy.device)
        self.stop: StopController | None = None  # from begin(): its clock starts there
        self.train_split = self.test_split = None
        self.model = self.optimizer = self.scheduler = self.batches = None
        self.steps = 0            # batches per epoch
        self.places: list = []    # (host, python prefix) of every rank
        self.hosts: list = []
        self.save_s = 0.0         # cost of the last in-segment save, counted in decisions
        self.ended_early: str | None = None  # why the run ended before its last epoch (done)

    def log(self, msg: str) -> None:
        self.report.log(msg)

    # ---- pieces a loop is built from
    def load_data(self) -> None:
        seed_everything(self.cfg.seed, self.cfg.deterministic, self.cfg.compile)
        self.data_dir = stage_split(self.data_dir, self.stage)  # node-local where asked
        self.train_split = Split.load(self.data_dir, train=True)
        self.test_split = Split.load(self.data_dir, train=False)

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
        self.meter.device = self.strategy.device  # where the strategy put the model

    # ---- the loop's steps
    def begin(self, stop: StopController | None = None) -> None:
        """Start the clock; ``stop`` is a controller shared with other runs (a fused group
        stops and saves all its members together)."""
        p = self.progress
        self.stop = stop or StopController(self.budget_s, self.cfg.margin_s, self.strategy,
                                           self.start_time, self.cfg.checkpoint_interval_s)
        self.save_s = 0.0
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

    def global_step(self) -> int:
        return self.progress.epoch * self.steps + self.progress.step

    def start_epoch(self) -> None:
        self.meter.start(self.progress)
        self.report.epoch_started()

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

    def after_batch(self, loss, hits, n: int) -> str | None:
        """Account one trained batch; inside an epoch, stop or save when all ranks agree."""
        self.account(loss, hits, n)
        if self.progress.step >= self.steps:
            return None  # the epoch's end decides
        return self._decide(self.meter.step_s() + self.save_s)

    def account(self, loss, hits, n: int) -> None:
        """One trained batch into the epoch's sums, the log and TensorBoard."""
        p, meter = self.progress, self.meter
        meter.add(p, loss, hits, n)
        log_now = meter.due_for_log(self.cfg.log_interval_s)
        if log_now:
            self.log(f"  epoch {p.epoch + 1}/{self.cfg.epochs} batch {p.step}/{self.steps} "
                     f"loss {loss.item():.4f} "
                     f"{meter.images_per_sec(p, self.strategy.world_size):,.0f} img/s")
        if self.report.board and (log_now or p.step >= self.steps):
            self.report.batch_loss(loss.item(), self.global_step())

    def _decide(self, next_step_s: float, settle: bool = False) -> str | None:
        reason, save = self.stop.decide(next_step_s, may_save=self.work_dir is not None,
                                        settle=settle)
        if reason or save:
            self.meter.fold(self.progress)
        if save:
            self.save_s = self.save(self.work_dir)
            self.stop.saved()
            self.report.saved()
            self.meter.restart_clock(self.progress)
        return reason

    def evaluate(self) -> dict:
        """Test accuracy of the model (evaluation.py)."""
        return evaluate(self.model, self.test_split, self.cfg, self.strategy)

    def end_epoch(self) -> str | None:
        """Record the finished epoch (reduced over ranks, evaluated); then, if more epochs
        follow in this segment, stop or save when all ranks agree."""
        rec = self.close_epoch(self.evaluate)
        if self.stopped_early():
            return EARLY_STOP  # the same records on every rank: the same decision
        if self.progress.epoch >= self.until_epoch:
            return None
        self.start_epoch()
        return self._decide(rec["wall_s"] / max(1, self.steps) + self.save_s, settle=True)

    def close_epoch(self, evaluate, folded: bool = False) -> dict:
        """The finished epoch's record (sums reduced over ranks; ``evaluate()`` the test
        accuracy, or a dict of test_acc and test_acc_tta), into the history, the log and
        TensorBoard; the next epoch begins. ``folded``: the caller folded the meter already
        (a fused group, before its evaluation)."""
        if not folded:
            self.meter.fold(self.progress)
        p, s = self.progress, self.strategy
        ips_rank = p.seen / p.train_s if p.train_s else 0.0
        sums = s.all_reduce(torch.tensor([p.loss_sum, p.correct, p.seen, ips_rank],
                                         dtype=torch.float64, device=s.reduce_device))
        gpu = self.report.gpu_use()
        t_eval = time.perf_counter()
        accs = evaluate()
        accs = accs if isinstance(accs, dict) else {"test_acc": accs}
        rec = {"epoch": p.epoch + 1, "train_loss": float(sums[0] / sums[2]),
               "train_acc": float(sums[1] / sums[2]), "test_acc": accs["test_acc"],
               "images_per_sec": float(sums[3]), "images_per_sec_per_rank": ips_rank,
               "wall_s": p.train_s, "eval_s": time.perf_counter() - t_eval,
               # this process's training window (wall clock, s since the epoch; the start
               # of the epoch or of this process's part of it): runs side by side line up
               "started_at": self.meter.started_at, "ended_at": self.meter.ended_at,
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

    # ---- the engine's own loop
    def run(self) -> dict:
        self.load_data()
        batches = self.make_batches()
        model = self.strategy.wrap(self.make_model())
        self.attach(model, *self.make_optimizer(model.parameters(), len(batches)), batches)
        self.resume()
        self.begin()
        p, reason = self.progress, None
        while reason is None and self.epochs_left():
            self.start_epoch()
            for x, y in self.batches.epoch(p.epoch, p.step):
                reason = self.after_batch(*self.train_step(x, y), len(y))
                if reason:
                    break
            else:
                reason = self.end_epoch()
        return self.finish(reason)


def run_training(order: SegmentOrder, start_time: float | None = None) -> dict:
    """Thin entry point: set the strategy up, let it drive a segment, always tear down."""
    from .strategies import get_strategy

    cfg = TrainConfig.read(Path(order.spec))
    strategy = get_strategy(cfg.strategy)(cfg, order.threads)
    try:
        strategy.setup()
        return strategy.train(Segment(cfg, strategy, order, start_time))
    finally:
        strategy.teardown()
        sys.stdout.flush()
