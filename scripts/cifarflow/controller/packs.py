"""The packs' side of the plan: how a pack's job trains its members (a Slurm step each, a
fused process, or an MPS-shared GPU), what it asks Slurm for, and every job's request shape
as the fit check reads it. Used by the WorkflowPlan's rules (workflow.py). No torch."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from ..engine.strategies import get_strategy
from ..engine.strategies.base import gpu_request
from ..job.mps_daemon import mps_gpus
from ..orders import PackOrder
from .pack_plan import Pack

# what a pack job's try got, as Snakemake fills it in (a retry changes the request)
PACK_TRY = {"threads": "{resources.cpus_per_task}", "budget_min": "{resources.runtime}",
            "mem_per_cpu": "{resources.mem_mb_per_cpu}", "slots": "{threads}",
            "record": "{output.record}"}
from .plan import Run

if TYPE_CHECKING:
    from .workflow import WorkflowPlan


def mem_per_cpu(mem_mb: int, cpus: int) -> int:
    """Memory per core, rounded up: a member's memory may come to no less than it asked."""
    return -(-int(mem_mb) // int(cpus))


def gres_model(resources: dict) -> str:
    """The GPU type a request names (gres gpu:<type>:<count>), "" where it names none."""
    parts = resources.get("gres", "").split(":")
    return parts[1] if len(parts) == 3 else ""


class StepPack:
    """The pack kind of pack.py (`cifarflow train-pack`): one task per member it trains, each
    a Slurm step with the member's own cores, memory (per core, so members may spread over
    nodes) and GPU, running the member's own `cifarflow train`; or, for a fused pack
    (``Pack.fuse``), one task that trains them all as one model (`cifarflow train-fused`):
    a member's cores, the members' memory together, one GPU. Another kind of pack is
    another class with these members, named by ``Pack.kind``."""

    # Snakemake's shell template: what a retry changes (the request) comes from `resources`
    # there, never from params, which Snakemake keeps from the first try
    command = "{params.prologue}{params.cifarflow} " + PackOrder.rule_command(
        "{params.args}", **PACK_TRY)

    def order(self, plan: "WorkflowPlan", pack: Pack, k: int, members: list[str]) -> PackOrder:
        """The pack's segment: which members, where they read and write, how they train
        (the request is its job's: PACK_TRY)."""
        first = plan.runs[pack.members[0]]  # the members share strategy, request and plan
        return PackOrder(pack=pack.name, segment=k, results=plan.results, data=plan.batches,
                         until_epoch=first.until_epoch(k),
                         stage_data=plan.config["data"]["stage"],
                         gpus=first.strategy_class.gpus_per_node(first.config),
                         fuse=pack.fuse or None, per_gpu=pack.per_gpu,
                         members=tuple(members))

    def args(self, plan: "WorkflowPlan", wildcards) -> str:
        """The order of the pack's segment job, but what its try's request fills in."""
        order = self.order(plan, plan.packs[wildcards.pack], int(wildcards.segment),
                           plan.pack_members(wildcards))
        return shlex.join(order.to_argv(leave=PACK_TRY))

    @staticmethod
    def task_count(pack: Pack, members: int) -> int:
        """One per member it trains; one for a fused pack."""
        return 1 if pack.fuse else members

    @staticmethod
    def task_mem_mb(pack: Pack, members: int, member_mem_mb: int) -> int:
        """A member's memory; a fused pack's one process: one member's (the runtime, the
        data, a model) and a share for each further member (pack.fuse_member_mem_mb), not
        every member's whole process again."""
        return member_mem_mb + (members - 1) * pack.member_share_mb if pack.fuse else member_mem_mb

    def gpus(self, pack: Pack, members: int) -> int:
        """GPUs of a GPU pack's job, all on one node: one a task."""
        return self.task_count(pack, members)

    def tasks(self, plan: "WorkflowPlan", wildcards) -> int:
        return self.task_count(plan.packs[wildcards.pack], len(plan.pack_members(wildcards)))

    def shape(self, pack: Pack, runs: dict[str, Run]) -> tuple[str, dict]:
        """What the pack's first segment asks (all its members), as routing.check_fit reads
        it, from the same counts as ``resources``."""
        res, members = pack.member_resources, len(pack.members)
        cpus = int(res["cpus_per_task"])
        shape = {"tasks": self.task_count(pack, members), "cpus_per_task": cpus,
                 "pack": not pack.fuse, "runtime": int(res["runtime"]),
                 "mem_per_cpu": mem_per_cpu(self.task_mem_mb(pack, members, res["mem_mb"]), cpus)}
        if self.on_gpu(runs[pack.members[0]]):
            shape.update(nodes=1, gpus_per_task=1, gpu_model=gres_model(res))
        elif pack.one_node:
            shape.update(nodes=1, spread="pack.nodes: any")  # the way out if it is too wide
        return f"pack {pack.name} ({members} runs)", shape

    @staticmethod
    def on_gpu(run: Run) -> bool:
        return run.strategy_class.gpus_per_node(run.config) > 0

    def threads(self, plan: "WorkflowPlan", wildcards) -> int:
        """Cores the local scheduler reserves: the members' together (a fused pack's one)."""
        pack = plan.packs[wildcards.pack]
        return self.tasks(plan, wildcards) * pack.member_resources["cpus_per_task"]

    def resources(self, plan: "WorkflowPlan", strategy: str) -> dict:
        """The request of a pack's segment. `mpi` tells the Slurm plugin not to wrap the job
        in a step of its own: each member is one; empty for one member (the plugin refuses
        an mpi job of one task), which the jobstep still runs outside a step of its own."""

        def cpus(wildcards):
            return plan.packs[wildcards.pack].member_resources["cpus_per_task"]

        def tasks(wildcards):
            return self.tasks(plan, wildcards)

        def task_mem_mb(wildcards, attempt):  # pack_request sizes a fused pack's whole process
            return plan.pack_request(wildcards, attempt).mem_mb

        res = {
            "tasks": tasks,
            "cpus_per_task": cpus,
            "mem_mb_per_cpu": lambda wildcards, input, attempt: mem_per_cpu(
                task_mem_mb(wildcards, attempt), cpus(wildcards)),
            "runtime": lambda wildcards, input, attempt: plan.pack_request(
                wildcards, attempt).runtime,
            "mpi": lambda wildcards: "srun" if tasks(wildcards) > 1 else "",
        }
        if get_strategy(strategy).device_kind == "cuda":
            model = plan.config["resources"]["gpu_model"]
            res["gres"] = lambda wildcards: gpu_request(model, self.gpus(
                plan.packs[wildcards.pack], len(plan.pack_members(wildcards))))["gres"]
            res["tasks_per_gpu"] = 0
        res.update(self.placement([p for p in plan.packs.values() if p.strategy == strategy][0],
                                  get_strategy(strategy).device_kind == "cuda"))
        return res

    @staticmethod
    def placement(pack: Pack, on_gpu: bool) -> dict:
        """Where a strategy's packs run (they share pack.nodes and pack.whole_node): one node
        (a GPU pack's GPUs always are; a CPU pack's members unless pack.nodes is any), the
        node held alone (--exclusive) with pack.whole_node."""
        res = {"nodes": 1} if on_gpu or pack.one_node else {}
        if pack.whole_node:
            res["slurm_extra"] = "--exclusive"
        return res


class MpsPack(StepPack):
    """A GPU pack whose members share each GPU (pack.per_gpu M, pack.py): the members' cores
    and memory as in StepPack, but G = ceil(members / M) GPUs, and ONE Slurm step holding the
    node's G GPUs (a step's GPU is its own) starts them under one private MPS daemon, M on
    each GPU."""

    def gpus(self, pack: Pack, members: int) -> int:
        """One per ``per_gpu`` members."""
        return mps_gpus(members, pack.per_gpu)

    def shape(self, pack: Pack, runs: dict[str, Run]) -> tuple[str, dict]:
        _, shape = super().shape(pack, runs)
        shape.pop("gpus_per_task", None)  # all on one node: G GPUs for its M-per-GPU tasks
        shape.update(gpus_per_node=self.gpus(pack, len(pack.members)), per_gpu=pack.per_gpu)
        return f"pack {pack.name} ({len(pack.members)} runs, {pack.per_gpu} per GPU)", shape


PACK_KINDS = {"steps": StepPack(), "mps": MpsPack()}


def describe_pack_nodes(packs: dict[str, Pack]) -> str:
    """The pack line's part on where a pack job's members run (pack.nodes, whole_node)."""
    first = next(iter(packs.values()), None)
    if first is None:
        return ""
    if first.whole_node:
        return ("; each pack job holds one whole node (pack.whole_node: --exclusive, the "
                "node's every core charged)")
    return ("; each pack job on one node (pack.nodes: 1)" if first.one_node else
            "; CPU packs' members spread over nodes as Slurm places them (pack.nodes: any)")


def job_shapes(runs: dict[str, Run], packs: dict[str, Pack]) -> dict[str, dict]:
    """The request of every segment job of the plan (a pack's first segment, with all its
    members), as routing.check_fit reads it."""
    shapes, packed = {}, set()
    for pack in packs.values():
        label, shapes_of_pack = PACK_KINDS[pack.kind].shape(pack, runs)
        shapes[label] = shapes_of_pack
        packed.update(pack.members)
    for name, run in runs.items():
        if name in packed:
            continue
        res, nodes = run.resources, run.resources.get("nodes")
        tasks = int(res.get("tasks") or int(res.get("tasks_per_node", 1)) * (nodes or 1))
        shape = {"tasks": tasks, "cpus_per_task": int(res["cpus_per_task"]),
                 "mem_mb_per_node": int(res["mem_mb"]),
                 "gpus_per_node": run.strategy_class.gpus_per_node(run.config),
                 "gpu_model": gres_model(res), "runtime": int(res["runtime"])}
        if nodes:
            shape.update(nodes=int(nodes), tasks_per_node=tasks // int(nodes))
        shapes[f"run {name}"] = shape
    return shapes
