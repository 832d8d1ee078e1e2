"""A segment's checkpoints and its end: its state and manifest, whether the run is done,
saving, resuming from the segment before (the choice agreed by all ranks, an elastic world
size), and publishing the segment with what it used. A part of engine/segment.py's Segment."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

import torch

from . import files as ckpt
from . import resume as resuming
from .. import self_stop
from ..build import rng_state, set_rng_state
from .keep_weights import keep_last_and_best
from .digest import weights_sha256
from ..state import Progress, slurm_restarts
from ..usage import rank_usage, segment_usage

EARLY_STOP = "early stop"  # end_epoch's reason when train.early_stop ends the run


class SegmentCheckpoints:
    """The Segment's checkpoint side (self: a Segment)."""

    def state(self) -> dict:
        """Called by every rank at an agreed save: the partial sums of all ranks are
        gathered (exactly: each row is one rank's, the others add zeros)."""
        p, s = self.progress, self.strategy
        rows = torch.zeros(s.world_size, 4, dtype=torch.float64, device=s.reduce_device)
        rows[s.rank] = torch.tensor([p.loss_sum, p.correct, p.seen, p.train_s],
                                    dtype=torch.float64)
        p.ranks = s.all_reduce(rows).tolist()
        return {"model": s.model_state(self.model),
                "optimizer": s.optimizer_state(self.model, self.optimizer),
                "trainer": {"scheduler": self.scheduler.state_dict(), "rng": rng_state(),
                            "progress": p.state_dict(), "config": self.cfg.to_dict()}}

    def meta(self) -> dict:
        p = self.progress
        return {"run": self.cfg.run, "config_hash": self.cfg.shaping_hash(),
                "config": self.cfg.to_dict(), "epoch": p.epoch, "step": p.step,
                "epochs": self.cfg.epochs, "until_epoch": self.until_epoch,
                "done": self.done(), "early_stop": self.stopped_early(),
                "segment_reached_target":
                p.epoch >= self.until_epoch, "world_size": self.strategy.world_size,
                "events": p.events, "segment_runs": p.segment_runs, "resizes": p.resizes,
                "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")}

    def stopped_early(self) -> str:
        """Why this run ended before its last epoch ('' if it did not): a fused member that
        diverged (``ended_early``), or train.early_stop, decided from the epoch records the
        checkpoint carries, so K segments decide as one does."""
        if self.ended_early:
            return self.ended_early
        if self.progress.epoch >= self.cfg.epochs:
            return ""  # it trained all its epochs
        return self.stopping.stop_reason(self.progress.history)

    def done(self) -> bool:
        return self.progress.epoch >= self.cfg.epochs or bool(self.stopped_early())

    def epochs_left(self) -> int:
        """Epochs this segment trains (a partial one counts); none once the run is done."""
        return 0 if self.stopped_early() else max(0, self.until_epoch - self.progress.epoch)

    def save(self, directory: Path) -> float:
        t0 = time.perf_counter()
        self.strategy.sync_buffers(self.model)
        history = "".join(json.dumps(r) + "\n" for r in self.progress.history)
        state, meta = self.state(), self.meta()
        if directory != self.work_dir:  # a published segment: the weights' fingerprint (every
            # rank: a sharded tensor is gathered); not on the in-segment saves of a sweep
            meta["weights_sha256"] = weights_sha256(state["model"])
        self.checkpointer.save(directory, state, meta, {ckpt.METRICS: history})
        took = time.perf_counter() - t0
        if directory == self.work_dir:
            self_stop.saved(self.out_dir)  # tests only: CIFARFLOW_TEST_STOP_AT=save:<k>
        return took

    def resume(self) -> Path | None:
        """Load the checkpoint rank 0 chose (resume.decide); every rank learns the choice
        (or the error) through one collective."""
        s = self.strategy
        self.places = s.gather_objects((socket.gethostname(), sys.prefix))  # per rank
        self.hosts = [host for host, _ in self.places]
        mine = (resuming.decide(self.cfg, self.until_epoch, self.out_dir, self.resume_dir,
                                self.work_dir) if s.is_main else None)
        decision = resuming.agree(s, mine, self.resume_dir, self.work_dir)
        for note in decision.notes:
            self.log(f"WARNING: {note}")
        if decision.path is not None:
            template = {"model": s.model_state(self.model),
                        "optimizer": s.optimizer_state(self.model, self.optimizer)}
            state = self.checkpointer.load(decision.path, template)
            s.load_model_state(self.model, state["model"])
            s.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
            trainer = state["trainer"]
            set_rng_state(trainer["rng"])
            self.progress = Progress.from_state_dict(trainer["progress"])
            if decision.resized_from:
                self._resize(decision.resized_from)
            else:
                self.scheduler.load_state_dict(trainer["scheduler"])
                self.progress.take_rank_share(s.rank)
            self.log(f"resumed from {decision.path} at epoch {self.progress.epoch + 1}, "
                     f"batch {self.progress.step}")
        self.progress.events += list(decision.notes)
        return decision.path

    def _resize(self, old_world: int) -> None:
        """Go on with another world size from an epoch boundary: the schedule is replayed
        for this world's batches per epoch, and the per-rank sums (all zero there) start
        anew for its ranks."""
        p = self.progress
        with warnings.catch_warnings():  # stepping a schedule without optimizer steps
            warnings.simplefilter("ignore")
            for _ in range(p.epoch * self.steps):
                self.scheduler.step()
        p.ranks = [[0.0, 0, 0, 0.0] for _ in range(self.strategy.world_size)]
        p.resizes.append({"epoch": p.epoch, "from": old_world, "to": self.strategy.world_size})
        self.log(f"elastic resume: world size {old_world} -> {self.strategy.world_size} at "
                 f"epoch {p.epoch + 1}; from here on the run is no longer bit-exact")


    def finish(self, reason: str | None) -> dict:
        p = self.progress
        if self.stop:  # flags of the last batch still in flight: the segment ends here
            self.stop.settle()
        if reason == EARLY_STOP:
            reason = None  # the run is done: its segment completed
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
            if self.work_dir and reason.startswith("signal"):
                # Slurm may still mark the job failed (TIMEOUT) and Snakemake then drops
                # its outputs: the in-segment copy is what the rerun resumes from
                self.save(self.work_dir)
        save_s = self.save(self.out_dir)
        self.log(f"checkpoint {self.out_dir} written in {save_s:.2f} s "
                 f"({'done' if self.done() else 'to be continued'})")
        if self.cfg.keep_weights == "last" and self.strategy.is_main:
            for name, freed in keep_last_and_best(self.out_dir):
                self.log(f"segments.keep_weights last: {name}'s weights removed "
                         f"({freed / 2**20:,.1f} MB)")
        return {"epoch": p.epoch, "step": p.step, "stopped": reason, "save_s": save_s,
                "done": self.done()}
