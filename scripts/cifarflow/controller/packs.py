"""What each kind of pack asks of Slurm (StepPack: a Slurm step a member, or one fused
process; MpsPack: members sharing a GPU through MPS): its job's command template, its tasks,
a task's memory, its GPUs, where it runs, and every job's request shape as the fit check
reads it. Pure functions of a Pack; the pack rules (pack_rules.py) ask them. No torch."""

from __future__ import annotations

from ..job.mps_daemon import mps_gpus
from ..orders import PackOrder
from .pack_plan import Pack
from .plan import Run

# what a pack job's try got, as Snakemake fills it in (a retry changes the request)
PACK_TRY = {"threads": "{resources.cpus_per_task}", "budget_min": "{resources.runtime}",
            "mem_per_cpu": "{resources.mem_mb_per_cpu}", "slots": "{threads}",
            "record": "{output.record}"}


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

    def shape(self, pack: Pack, runs: dict[str, Run]) -> tuple[str, dict]:
        """What the pack's first segment asks (all its members), as routing.check_fit reads
        it, from the same counts as its rule's resources (PackRules.resources)."""
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


def job_shapes(runs: dict[str, Run], packs: dict[str, Pack]) -> dict[str, dict]:
    """The request of every segment job of the plan (a pack's first segment, with all its
    members), as routing.check_fit reads it."""
    return {label: shape for label, _, shape in job_units(runs, packs)}


def job_units(runs: dict[str, Run], packs: dict[str, Pack]):
    """(label, ("pack" or "run", its name), shape) of every segment job of the plan."""
    packed = set()
    for pack in packs.values():
        label, shape = PACK_KINDS[pack.kind].shape(pack, runs)
        packed.update(pack.members)
        yield label, ("pack", pack.name), shape
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
        yield f"run {name}", ("run", name), shape
