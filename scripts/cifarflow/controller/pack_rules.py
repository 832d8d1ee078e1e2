"""What a packed strategy's training rule asks of the plan, per pack and segment: the
members its job trains, the order it gets, its threads and its request (the pack's kind:
packs.py), sized from the members' previous segments (rules.Requests). Functions a rule
calls take Snakemake's arguments by name (``wildcards``, ``input``, ``attempt``). The
WorkflowPlan's ``pack_rules``. No torch."""

from __future__ import annotations

import dataclasses
import shlex

from ..engine.strategies import get_strategy
from ..engine.cuda import gpu_request
from ..layout import RunPaths, pack_marker
from ..orders import PackOrder
from .chain import Chain
from .pack_plan import Pack
from .packs import PACK_KINDS, PACK_TRY, StepPack, mem_per_cpu
from .placement import Placement, joined
from .plan import Run
from .rules import Requests


class PackRules:
    """The training rule of a packed strategy: one job per pack and segment."""

    def __init__(self, runs: dict[str, Run], packs: dict[str, Pack], chain: Chain,
                 requests: Requests, placement: Placement, config: dict, data: str, error):
        self.runs, self.packs, self.chain = runs, packs, chain
        self.requests, self.placement, self.data, self.error = requests, placement, data, error
        self.results, self.stage = config["results"], config["data"]["stage"]
        self.gpu_model = config["resources"]["gpu_model"]

    def kind(self, strategy: str) -> StepPack:
        """How a strategy's packs train (PACK_KINDS); a strategy's packs share one kind."""
        kinds = {pack.kind for pack in self.packs.values() if pack.strategy == strategy}
        if len(kinds) != 1:
            raise self.error(f"packs of {strategy}: one kind each, not {sorted(kinds)}")
        return PACK_KINDS[kinds.pop()]

    def members(self, wildcards) -> list[str]:
        """The runs a pack's segment job trains (all, but after pruning and in extra segments)."""
        return self.chain.members(wildcards.pack, int(wildcards.segment))

    def previous(self, wildcards):
        k = int(wildcards.segment)
        return pack_marker(self.results, wildcards.pack, k - 1) if k > 1 else []

    def specs(self, wildcards) -> list[str]:
        return [RunPaths(self.results, run).spec for run in self.packs[wildcards.pack].members]

    def order(self, wildcards) -> PackOrder:
        """The order of the pack's segment job (Pack.order)."""
        pack, members = self.packs[wildcards.pack], self.members(wildcards)
        return pack.order(int(wildcards.segment), members, self.runs[pack.members[0]],
                          results=self.results, data=self.data, stage=self.stage)

    def args(self, strategy: str):
        """The pack job's order, but what its try's request fills in (packs.PACK_TRY)."""
        return lambda wildcards: shlex.join(self.order(wildcards).to_argv(leave=PACK_TRY))

    def command(self, strategy: str) -> str:
        """The pack job's command line (a shell template), built by its kind."""
        return self.kind(strategy).command

    def tasks(self, wildcards) -> int:
        pack = self.packs[wildcards.pack]
        return PACK_KINDS[pack.kind].task_count(pack, len(self.members(wildcards)))

    def threads(self, strategy: str):
        """Cores the local scheduler reserves: the members' together (a fused pack's one)."""
        return lambda wildcards: (self.tasks(wildcards)
                                  * self.packs[wildcards.pack].member_resources["cpus_per_task"])

    def request(self, wildcards, attempt: int):
        """A member task's request, sized from all members' previous segments (Requests);
        a fused pack's one process as a whole (its members record that process's peak)."""
        k, members = int(wildcards.segment), self.members(wildcards)
        previous = [RunPaths(self.results, run).segment(k - 1) for run in members] if k > 1 else []
        pack, policy = self.packs[wildcards.pack], None
        if pack.fuse:
            first = self.runs[members[0]].policy
            whole = StepPack.task_mem_mb(pack, len(members), first.mem_mb)
            policy = dataclasses.replace(first, mem_mb=whole,
                                         max_mem_mb=max(first.max_mem_mb, whole))
        return self.requests.sized(members, k, previous, attempt, wildcards.pack, policy)

    def resources(self, strategy: str) -> dict:
        """The request of a strategy's pack segments, then the config's placement (slurm.extra
        joins the pack's own sbatch options: pack.whole_node's --exclusive). `mpi` tells the
        Slurm plugin not to wrap the job in a step of its own: the members' step is; empty for
        one member (the plugin refuses an mpi job of one task), which the jobstep still runs
        outside a step of its own."""
        kind, gpu = self.kind(strategy), get_strategy(strategy).device_kind == "cuda"

        def cpus(wildcards):
            return self.packs[wildcards.pack].member_resources["cpus_per_task"]

        def task_mem_mb(wildcards, attempt):  # request sizes a fused pack's whole process
            return self.request(wildcards, attempt).mem_mb

        own = {
            "tasks": lambda wildcards: self.tasks(wildcards),
            "cpus_per_task": cpus,
            "mem_mb_per_cpu": lambda wildcards, input, attempt: mem_per_cpu(
                task_mem_mb(wildcards, attempt), cpus(wildcards)),
            "runtime": lambda wildcards, input, attempt: self.request(wildcards,
                                                                      attempt).runtime,
            "mpi": lambda wildcards: "srun" if self.tasks(wildcards) > 1 else "",
        }
        own.update(kind.placement([p for p in self.packs.values() if p.strategy == strategy][0],
                                  gpu))
        placement = self.placement.for_job(gpu)
        extra = joined(own.get("slurm_extra"), placement.get("slurm_extra"))
        res = {**own, **placement, **({"slurm_extra": extra} if extra else {})}
        if gpu:  # its GPUs as placement.py asks them (--gpus-per-node=<type>:<n>)
            res["slurm_extra"] = lambda wildcards: joined(self.placement.gpus(gpu_request(
                self.gpu_model, kind.gpus(self.packs[wildcards.pack],
                                          len(self.members(wildcards))))["gres"]), extra)
        return res
