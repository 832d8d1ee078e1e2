"""What the training rules ask of the plan, per run or pack and segment: the command's
arguments, the threads, the launcher, the request (sized from the last segment where
resources.autosize), the resources. Functions a rule calls take Snakemake's arguments by
name (``wildcards``, ``input``, ``attempt``). A part of the WorkflowPlan. No torch."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Callable

from ..engine.strategies import get_strategy
from ..job.tries import out_of_memory_count
from ..layout import RunPaths, pack_marker
from ..orders import SegmentOrder
from .packs import PACK_KINDS, StepPack

# what a segment job's try got, as Snakemake fills it in (a retry changes the request)
SEGMENT_TRY = {"threads": "{resources.cpus_per_task}", "budget_min": "{resources.runtime}",
               "mem_mb": "{resources.mem_mb}", "attempt": "{resources.attempt}"}
from .plan import Run


class SegmentRules:
    """The training rules' attributes: a run's segments, and a pack's."""

    # ---- a run's segments (one job per run and segment)
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

    def previous_segment(self, wildcards):
        k = int(wildcards.segment)
        return RunPaths(self.results, wildcards.run).segment(k - 1) if k > 1 else []

    def segment_order(self, run: str, k: int) -> SegmentOrder:
        """Segment k of the run: where it reads and writes, its target epoch (the request
        is its job's: SEGMENT_TRY)."""
        return SegmentOrder.of_segment(RunPaths(self.results, run), k, data=self.batches,
                                       until_epoch=self.runs[run].until_epoch(k),
                                       stage=self.config["data"]["stage"])

    def segment_args(self, wildcards) -> str:
        """The segment job's order (`cifarflow train`), but what its try's request fills in."""
        order = self.segment_order(wildcards.run, int(wildcards.segment))
        return shlex.join(order.to_argv(leave=SEGMENT_TRY))

    def sized_request(self, runs: list[str], k: int, previous: list, attempt: int, name: str,
                      policy=None):
        """The request of segment k of `runs` (one, or a pack's members, who share one):
        the configured one (``policy``, else the first run's), or from the previous
        segment's measurement (resources.autosize), with more memory after tries of this
        segment that ran out of it (retries only)."""
        first = self.runs[runs[0]]
        ooms = 0
        if attempt > 1:
            ooms = max(out_of_memory_count(RunPaths(self.results, run).root, k,
                                           logs_dir=RunPaths(self.results, run).logs)
                       for run in runs)
        request = (policy or first.policy).request(previous, first.until_epoch(k), ooms)
        if request.why and (name, k, attempt) not in self.sizing_logged:
            self.sizing_logged.add((name, k, attempt))
            self.log.info(f"{name} segment {k}: {request.why}")
        return request

    def segment_request(self, key: str):
        """mem_mb or runtime of a segment job, sized (sized_request) once its input exists."""

        def value(wildcards, input, attempt):
            k = int(wildcards.segment)
            previous = [input.previous] if k > 1 and Path(input.previous).is_dir() else []
            return getattr(self.sized_request([wildcards.run], k, previous, attempt,
                                              wildcards.run), key)

        return value

    def run_resources(self, strategy: str) -> dict:
        """Rule resources, per run, plus `mpi`: its presence tells the Slurm jobstep not to
        wrap the command in an srun step of its own, since our launcher starts the step.
        Empty for one task (the plugin submits it as such; it refuses an mpi job of one task).
        Memory and runtime are sized per segment (segment_request)."""
        keys = sorted({key for name in self.runs_of(strategy) for key in self.runs[name].resources})
        res = {key: self.per_run(strategy, lambda run, key=key: run.resources[key])
               for key in keys}
        res.update(mem_mb=self.segment_request("mem_mb"), runtime=self.segment_request("runtime"))
        for key in self.placement(False):  # the account by whether the run asks GPUs
            res[key] = self.per_run(strategy, lambda run, key=key: self.placement(
                run.strategy_class.gpus_per_node(run.config) > 0)[key])
        res["mpi"] = self.per_run(strategy,
                                  lambda run: "srun" if run.config.world_size > 1 else "")
        return res

    # ---- a pack's segments (one job per pack and segment) --------------------------------
    def pack_kind(self, strategy: str):
        """How a strategy's packs train (PACK_KINDS); a strategy's packs share one kind."""
        kinds = {pack.kind for pack in self.packs.values() if pack.strategy == strategy}
        if len(kinds) != 1:
            raise self.error(f"packs of {strategy}: one kind each, not {sorted(kinds)}")
        return PACK_KINDS[kinds.pop()]

    def pack_members(self, wildcards) -> list[str]:
        """The runs a pack's segment job trains (all, but after pruning and in extra segments)."""
        return self.chain.members(wildcards.pack, int(wildcards.segment))

    def previous_pack_segment(self, wildcards):
        k = int(wildcards.segment)
        return pack_marker(self.results, wildcards.pack, k - 1) if k > 1 else []

    def pack_specs(self, wildcards) -> list[str]:
        return [RunPaths(self.results, run).spec for run in self.packs[wildcards.pack].members]

    def pack_request(self, wildcards, attempt: int):
        """A member task's request, sized from all members' previous segments (sized_request);
        a fused pack's one process as a whole (its members record that process's peak)."""
        k, members = int(wildcards.segment), self.pack_members(wildcards)
        previous = [RunPaths(self.results, run).segment(k - 1) for run in members] if k > 1 else []
        pack, policy = self.packs[wildcards.pack], None
        if pack.fuse:
            first = self.runs[members[0]].policy
            whole = StepPack.task_mem_mb(pack, len(members), first.mem_mb)
            policy = dataclasses.replace(first, mem_mb=whole,
                                         max_mem_mb=max(first.max_mem_mb, whole))
        return self.sized_request(members, k, previous, attempt, wildcards.pack, policy)

    def pack_resources(self, strategy: str) -> dict:
        """A pack's request and the config's placement; slurm.extra joins the pack's own
        sbatch options (pack.whole_node's --exclusive)."""
        gpu = get_strategy(strategy).device_kind == "cuda"  # as its request's gres
        own, placement = self.pack_kind(strategy).resources(self, strategy), self.placement(gpu)
        extra = " ".join(filter(None, (own.get("slurm_extra"), placement.get("slurm_extra"))))
        return {**own, **placement, **({"slurm_extra": extra} if extra else {})}

    def pack_threads(self, strategy: str):
        kind = self.pack_kind(strategy)
        return lambda wildcards: kind.threads(self, wildcards)

    def pack_args(self, strategy: str):
        kind = self.pack_kind(strategy)
        return lambda wildcards: kind.args(self, wildcards)

    def pack_command(self, strategy: str) -> str:
        """The pack job's command line (a shell template), built by its kind."""
        return self.pack_kind(strategy).command
