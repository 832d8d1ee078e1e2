"""One run's checkpoints: what a save holds (state and manifest), saving, resuming from the
segment before (the choice agreed by all ranks, an elastic world size) and publishing the
segment. A collaborator of engine/segment.py's ledger: given what it needs, it writes none
of the ledger's fields (a resume hands the progress it read back)."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from . import files as ckpt
from . import resume as resuming
from .. import self_stop
from ..build import rng_state, set_rng_state
from ..state import Progress
from .digest import weights_sha256
from .keep_weights import keep_last_and_best


class Trained(NamedTuple):
    """What a checkpoint holds of a run besides its progress: the model as the loop calls it
    (wrapped), its optimizer and schedule."""
    model: object
    optimizer: object
    scheduler: object


class RunCheckpoints:
    """Where segment ``order`` (orders.SegmentOrder) of the run ``cfg`` reads and writes its
    checkpoints, under ``strategy``; ``log`` says what it did."""

    def __init__(self, cfg, strategy, order, until_epoch: int, log):
        self.cfg, self.strategy, self.until_epoch, self.log = cfg, strategy, until_epoch, log
        self.out_dir = Path(order.out)
        self.resume_dir = Path(order.resume) if order.resume else None
        self.work_dir = Path(order.work) if order.work else None  # in-segment saves
        self.checkpointer = strategy.checkpointer()

    def state(self, trained: Trained, progress: Progress) -> dict:
        """Called by every rank at an agreed save: the partial sums of all ranks are
        gathered (exactly: each row is one rank's, the others add zeros)."""
        p, s = progress, self.strategy
        rows = torch.zeros(s.world_size, 4, dtype=torch.float64, device=s.reduce_device)
        rows[s.rank] = torch.tensor([p.loss_sum, p.correct, p.seen, p.train_s],
                                    dtype=torch.float64)
        p.ranks = s.all_reduce(rows).tolist()
        return {"model": s.model_state(trained.model),
                "optimizer": s.optimizer_state(trained.model, trained.optimizer),
                "trainer": {"scheduler": trained.scheduler.state_dict(), "rng": rng_state(),
                            "progress": p.state_dict(), "config": self.cfg.to_dict()}}

    def meta(self, progress: Progress, done: bool, early_stop: str) -> dict:
        p = progress
        return {"run": self.cfg.run, "config_hash": self.cfg.shaping_hash(),
                "config": self.cfg.to_dict(), "epoch": p.epoch, "step": p.step,
                "epochs": self.cfg.epochs, "until_epoch": self.until_epoch,
                "done": done, "early_stop": early_stop,
                "segment_reached_target":
                p.epoch >= self.until_epoch, "world_size": self.strategy.world_size,
                "events": p.events, "segment_runs": p.segment_runs, "resizes": p.resizes,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")}

    def save(self, directory: Path, trained: Trained, progress: Progress, done: bool,
             early_stop: str) -> float:
        """Seconds it took to write ``directory`` (the work dir: an in-segment save)."""
        t0 = time.perf_counter()
        self.strategy.sync_buffers(trained.model)
        history = "".join(json.dumps(r) + "\n" for r in progress.history)
        state, meta = self.state(trained, progress), self.meta(progress, done, early_stop)
        if directory != self.work_dir:  # a published segment: the weights' fingerprint (every
            # rank: a sharded tensor is gathered); not on the in-segment saves of a sweep
            meta["weights_sha256"] = weights_sha256(state["model"])
        self.checkpointer.save(directory, state, meta, {ckpt.METRICS: history})
        took = time.perf_counter() - t0
        if directory == self.work_dir:
            self_stop.saved(self.out_dir)  # tests only: CIFARFLOW_TEST_STOP_AT=save:<k>
        return took

    def resume(self, trained: Trained, steps: int) -> tuple[Progress | None, list]:
        """Load the checkpoint rank 0 chose (resume.decide) into ``trained``; every rank
        learns the choice (or the error) through one collective. Returns the progress it
        read (None: nothing to resume) and the notes of the choice."""
        s = self.strategy
        mine = (resuming.decide(self.cfg, self.until_epoch, self.out_dir, self.resume_dir,
                                self.work_dir) if s.is_main else None)
        decision = resuming.agree(s, mine, self.resume_dir, self.work_dir)
        for note in decision.notes:
            self.log(f"WARNING: {note}")
        progress = None
        if decision.path is not None:
            template = {"model": s.model_state(trained.model),
                        "optimizer": s.optimizer_state(trained.model, trained.optimizer)}
            state = self.checkpointer.load(decision.path, template)
            s.load_model_state(trained.model, state["model"])
            s.load_optimizer_state(trained.model, trained.optimizer, state["optimizer"])
            saved = state["trainer"]
            set_rng_state(saved["rng"])
            progress = Progress.from_state_dict(saved["progress"])
            if decision.resized_from:
                self._resize(progress, trained.scheduler, steps, decision.resized_from)
            else:
                trained.scheduler.load_state_dict(saved["scheduler"])
                progress.take_rank_share(s.rank)
            self.log(f"resumed from {decision.path} at epoch {progress.epoch + 1}, "
                     f"batch {progress.step}")
        return progress, list(decision.notes)

    def _resize(self, p: Progress, scheduler, steps: int, old_world: int) -> None:
        """Go on with another world size from an epoch boundary: the schedule is replayed
        for this world's batches per epoch, and the per-rank sums (all zero there) start
        anew for its ranks."""
        with warnings.catch_warnings():  # stepping a schedule without optimizer steps
            warnings.simplefilter("ignore")
            for _ in range(p.epoch * steps):
                scheduler.step()
        p.ranks = [[0.0, 0, 0, 0.0] for _ in range(self.strategy.world_size)]
        p.resizes.append({"epoch": p.epoch, "from": old_world, "to": self.strategy.world_size})
        self.log(f"elastic resume: world size {old_world} -> {self.strategy.world_size} at "
                 f"epoch {p.epoch + 1}; from here on the run is no longer bit-exact")

    def publish(self, trained: Trained, progress: Progress, done: bool, early_stop: str,
                reason: str | None) -> float:
        """The segment's checkpoint, in out_dir (and, stopped by a signal, in the work dir
        too); returns the seconds its writing took."""
        if reason and self.work_dir and reason.startswith("signal"):
            # Slurm may still mark the job failed (TIMEOUT) and Snakemake then drops
            # its outputs: the in-segment copy is what the rerun resumes from
            self.save(self.work_dir, trained, progress, done, early_stop)
        save_s = self.save(self.out_dir, trained, progress, done, early_stop)
        self.log(f"checkpoint {self.out_dir} written in {save_s:.2f} s "
                 f"({'done' if done else 'to be continued'})")
        if self.cfg.keep_weights == "last" and self.strategy.is_main:
            for name, freed in keep_last_and_best(self.out_dir):
                self.log(f"segments.keep_weights last: {name}'s weights removed "
                         f"({freed / 2**20:,.1f} MB)")
        return save_s
