"""What a run's training rule asks of the plan, per run and segment: the command's
arguments, the threads, the launcher, the request (sized from the last segment where
resources.autosize), the resources; and the sizing a pack's rule shares (Requests).
Functions a rule calls take Snakemake's arguments by name (``wildcards``, ``input``,
``attempt``). The WorkflowPlan's ``run_rules``. No torch."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Callable

from ..job.tries import out_of_memory_count
from ..layout import RunPaths
from ..orders import SegmentOrder
from .placement import Placement
from .plan import Run

# what a segment job's try got, as Snakemake fills it in (a retry changes the request)
SEGMENT_TRY = {"threads": "{resources.cpus_per_task}", "budget_min": "{resources.runtime}",
               "mem_mb": "{resources.mem_mb}", "attempt": "{resources.attempt}"}


class Requests:
    """The request of a segment job of one run or of a pack's members (who share one),
    each sizing said once in the log."""

    def __init__(self, results: str, runs: dict[str, Run], log):
        self.results, self.runs, self.log = results, runs, log
        self.said: set = set()

    def sized(self, runs: list[str], k: int, previous: list, attempt: int, name: str,
              policy=None):
        """The request of segment k of ``runs``: the configured one (``policy``, else the
        first run's), or from the previous segment's measurement (resources.autosize),
        with more memory after tries of this segment that ran out of it (retries only)."""
        first = self.runs[runs[0]]
        ooms = 0
        if attempt > 1:
            ooms = max(out_of_memory_count(RunPaths(self.results, run).root, k,
                                           logs_dir=RunPaths(self.results, run).logs)
                       for run in runs)
        request = (policy or first.policy).request(previous, first.until_epoch(k), ooms)
        if request.why and (name, k, attempt) not in self.said:
            self.said.add((name, k, attempt))
            self.log.info(f"{name} segment {k}: {request.why}")
        return request


class RunRules:
    """The training rule of an unpacked strategy: one job per run and segment."""

    # the segment job's command line, a Snakemake shell template: the request comes from
    # `resources` (a retry changes it; params keep the first try's values)
    command = ("{params.prologue}{params.launch} {params.cifarflow} "
               + SegmentOrder.rule_command("{params.args}", **SEGMENT_TRY))

    def __init__(self, runs: dict[str, Run], requests: Requests, placement: Placement, *,
                 results: str, data: str, stage: str, python: str):
        self.runs, self.requests, self.placement = runs, requests, placement
        self.results, self.data, self.stage, self.python = results, data, stage, python

    def runs_of(self, strategy: str) -> list[str]:
        return [name for name, run in self.runs.items() if run.strategy == strategy]

    def per_run(self, strategy: str, value_of: Callable[[Run], object]):
        """An attribute of a training rule, as one constant where all runs of the strategy
        share it (Snakemake evaluates a function for every job, which a sweep of thousands of
        jobs feels), else a function of the run wildcard."""
        values = {name: value_of(self.runs[name]) for name in self.runs_of(strategy)}
        if len(set(map(repr, values.values()))) == 1:
            return next(iter(values.values()))
        return lambda wildcards: values[wildcards.run]

    def threads(self, strategy: str):
        return self.per_run(strategy, lambda run: run.threads)

    def launch_prefix(self, strategy: str):
        """What the training command starts under: the strategy's launcher and wrappers."""
        return self.per_run(strategy,
                            lambda run: run.strategy_class.command_prefix(self.python, run))

    def previous(self, wildcards):
        k = int(wildcards.segment)
        return RunPaths(self.results, wildcards.run).segment(k - 1) if k > 1 else []

    def order(self, run: str, k: int) -> SegmentOrder:
        """Segment k of the run: where it reads and writes, its target epoch (the request
        is its job's: SEGMENT_TRY)."""
        return SegmentOrder.of_segment(RunPaths(self.results, run), k, data=self.data,
                                       until_epoch=self.runs[run].until_epoch(k),
                                       stage=self.stage)

    def args(self, wildcards) -> str:
        """The segment job's order (`cifarflow train`), but what its try's request fills in."""
        order = self.order(wildcards.run, int(wildcards.segment))
        return shlex.join(order.to_argv(leave=SEGMENT_TRY))

    def request(self, key: str):
        """mem_mb or runtime of a segment job, sized (Requests) once its input exists."""

        def value(wildcards, input, attempt):
            k = int(wildcards.segment)
            previous = [input.previous] if k > 1 and Path(input.previous).is_dir() else []
            return getattr(self.requests.sized([wildcards.run], k, previous, attempt,
                                               wildcards.run), key)

        return value

    def resources(self, strategy: str) -> dict:
        """Rule resources, per run (its request, its GPUs and account as placement.py asks
        them), plus `mpi`: its presence tells the Slurm jobstep not to wrap the command in an
        srun step of its own, since our launcher starts the step. Empty for one task (the
        plugin submits it as such; it refuses an mpi job of one task). Memory and runtime are
        sized per segment (request)."""
        jobs = {name: self.placement.job(self.runs[name].resources)
                for name in self.runs_of(strategy)}
        keys = sorted({key for job in jobs.values() for key in job})
        res = {key: self.per_run(strategy, lambda run, key=key: jobs[run.name].get(key, ""))
               for key in keys}
        res.update(mem_mb=self.request("mem_mb"), runtime=self.request("runtime"))
        res["mpi"] = self.per_run(strategy,
                                  lambda run: "srun" if run.config.world_size > 1 else "")
        return res
