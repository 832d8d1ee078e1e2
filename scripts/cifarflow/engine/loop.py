"""The training loop: one, for one run or K fused members.

A step (engine/step.py's ``PlainStep``: one run's wrapped model and optimizer;
engine/fused/step.py's ``FusedStep``: K members as one model) trains a batch; the loop
keeps the books of its members' ledgers (engine/segment.py): the accounting of a step, the
stop/save decision agreed by every rank (one for all members), the end of an epoch with
its evaluation, and a member that leaves early (train.early_stop, a fused member's
diverged loss). A framework that runs its own batches (Lightning) calls the same hooks:
``begin``, ``start_epoch``, ``after_batch``, ``end_epoch``, ``finish``."""

from __future__ import annotations

import time

from .meter import EpochMeter
from .stop import StopController

EARLY_STOP = "early stop"  # end_epoch's reason when every member's run ended early


class Loop:
    def __init__(self, step, say=None):
        """``step``'s members trained together; ``say``: the group's own lines (a fused
        group's), None for a run alone."""
        self.step, self.runs, self.say = step, list(step.members), say
        self.meter = EpochMeter(step.strategy.device)
        self.stop: StopController | None = None  # from begin(): its clock starts there
        self.save_s = 0.0  # cost of the last in-segment save, counted in decisions
        self.results: dict = {}  # run -> its segment's result, once it finished

    @property
    def lead(self):
        """The member whose position, clock and budget stand for all (they share them)."""
        return self.runs[0]

    def train(self) -> dict:
        """Train the members to their target epoch or an agreed stop; each one's result."""
        self.begin()
        reason = None
        while reason is None and self.runs and self.lead.epochs_left():
            p = self.lead.progress
            for x, y in self.step.batches.epoch(p.epoch, p.step):
                reason = self.after_batch(*self.step.train_step(x, y), y.shape[-1])
                if reason:
                    break
            else:
                reason = self.end_epoch()
        return self.finish(reason)

    def begin(self) -> None:
        """Start the clock; a member whose run ended already publishes as it is."""
        lead = self.lead
        self.stop = StopController(lead.budget_s, lead.cfg.margin_s, lead.strategy,
                                   lead.start_time, lead.cfg.checkpoint_interval_s)
        for run in self.runs:
            run.begin()
        self.leave([run for run in self.runs if run.stopped_early()])
        self.start_epoch()

    def start_epoch(self) -> None:
        if self.runs:
            self.meter.start([run.progress for run in self.runs])
            for run in self.runs:
                run.report.epoch_started()

    def after_batch(self, loss, hits, n: int) -> str | None:
        """Account one trained batch; inside an epoch, stop or save when all ranks agree."""
        self.account(loss, hits, n)
        if self.lead.progress.step >= self.lead.steps:
            return None  # the epoch's end decides
        return self.decide(self.meter.step_s() + self.save_s)

    def account(self, loss, hits, n: int) -> None:
        """One trained batch into the epoch's sums; each member's log line and TensorBoard
        point when due (one copy of the K losses to the host)."""
        meter, lead = self.meter, self.lead
        meter.add(loss, hits, n)
        due = meter.due_for_log(lead.cfg.log_interval_s)
        p = lead.progress
        if not (due or (p.step >= lead.steps and lead.report.board)):
            return
        ips = meter.images_per_sec(lead.strategy.world_size) if due else 0.0
        for run, value in zip(self.runs, loss.reshape(-1).tolist()):
            if due:
                run.log(f"  epoch {p.epoch + 1}/{run.cfg.epochs} batch {p.step}/{lead.steps} "
                        f"loss {value:.4f} {ips:,.0f} img/s{self.step.note}")
            run.report.batch_loss(value, lead.global_step())

    def decide(self, next_step_s: float, settle: bool = False) -> str | None:
        """The stop/save decision at a batch boundary, agreed by all ranks, for all
        members; a save writes every member's work dir."""
        may_save = all(run.work_dir is not None for run in self.runs)
        reason, save = self.stop.decide(next_step_s, may_save, settle=settle)
        if reason or save:
            self.meter.fold()
        if save:
            t0 = time.perf_counter()
            self.step.export()
            for run in self.runs:
                run.save(run.work_dir)
                run.report.saved()
            self.save_s = time.perf_counter() - t0
            self.stop.saved()
            self.meter.restart_clock()
        return reason

    def end_epoch(self) -> str | None:
        """Record the finished epoch of every member; members whose run ended leave; then,
        if more epochs follow in this segment, stop or save when all ranks agree."""
        self.close_epoch()
        self.leave([run for run in self.runs if self.ended(run)])
        if not self.runs:
            return EARLY_STOP  # the same records on every rank: the same decision
        lead = self.lead
        if lead.progress.epoch >= lead.until_epoch:
            return None
        self.start_epoch()
        wall_s = lead.progress.history[-1]["wall_s"]
        return self.decide(wall_s / max(1, lead.steps) + self.save_s, settle=True)

    def close_epoch(self) -> None:
        """Every member's epoch record: the sums and training time folded first (the
        evaluation is not training time), one evaluation for all, the GPU sampled once."""
        self.meter.fold()
        window = self.meter.started_at, self.meter.ended_at
        self.step.sync_schedules()  # the records' lr
        sums = [run.reduced_sums() for run in self.runs]
        gpu = self.lead.report.gpu_use()
        t_eval = time.perf_counter()
        accs = self.step.evaluate()
        eval_s = (time.perf_counter() - t_eval) / len(self.runs)
        for run, run_sums, run_accs in zip(self.runs, sums, accs):
            run.close_epoch(run_sums, run_accs, eval_s, gpu, window)

    def ended(self, run) -> bool:
        if self.step.ends_diverged:
            run.check_finite()
        return bool(run.stopped_early())

    def leave(self, ended: list) -> None:
        """Members whose run ended publish their checkpoint and leave; the step goes on
        with the others."""
        if not ended:
            return
        self.step.export()
        for run in ended:
            if self.say:
                self.say(f"{run.cfg.run}: {run.stopped_early()}; it leaves the fused group")
            self.results[run.cfg.run] = run.finish(None)
        self.runs = [run for run in self.runs if run not in ended]
        if self.runs:
            self.step = self.step.without(ended)

    def finish(self, reason: str | None) -> dict:
        """The members still in end their segment: each one's result, by run."""
        if self.stop:  # flags of the last batch still in flight: the segment ends here
            self.stop.settle()
        if reason == EARLY_STOP:
            reason = None  # the runs are done: their segments completed
        if self.runs:
            self.step.export()
        for run in self.runs:
            self.results[run.cfg.run] = run.finish(reason)
        return self.results


def train_alone(segment) -> dict:
    """The engine's own loop for one run: built, resumed, trained; its result."""
    from .step import PlainStep

    segment.build()
    segment.resume()
    return Loop(PlainStep(segment)).train()[segment.cfg.run]
