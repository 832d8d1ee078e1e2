"""What the plan says at `snakemake -n` of what it submits: pruning, packing (how many
packs, where their members run, GPUs shared through MPS, fusion) and what it will store
under results/. Lines, said by the main process. No torch."""

from __future__ import annotations

from ..job.mps_daemon import mps_gpus
from . import storage
from .pack_plan import Pack, describe_fusion


def plan_lines(config: dict, runs: dict, packs: dict[str, Pack], search: list[str],
               estimate: storage.Estimate) -> list[str]:
    """The log lines of pruning, packing, the search (``search``: rounds.py's) and storage."""
    lines, prune, per_job = [], config["sweep"].get("prune"), config["pack"]["runs_per_job"]
    if prune:
        lines.append(
            f"sweep.prune: the runs of each strategy are ranked on {prune['metric']} after "
            f"segment(s) {', '.join(map(str, sorted(prune['at_segments'])))}; the segments "
            "after a pruning point depend on that ranking and join the plan once it is known")
    if per_job > 1:
        packed = sorted({pack.strategy for pack in packs.values()})
        unpacked = [s for s in config["strategies"] if s not in packed]
        lines.append(
            f"pack: {sum(len(p.members) for p in packs.values())} runs of "
            f"{', '.join(packed) or 'no strategy'} in {len(packs)} packs of up to {per_job}, "
            "one job per pack and segment"
            + (f"; {', '.join(unpacked)} (several processes per run): one job per run and "
               "segment" if unpacked else "") + describe_pack_nodes(packs)
            + describe_sharing(packs))
    if config["pack"]["fuse"] and packs:
        lines.append(describe_fusion(runs, packs))
    lines += search
    keep_weights = config["segments"]["keep_weights"]  # settled: all or last (plan.py)
    lines.append(storage.describe(estimate, keep_weights))
    if config["train"]["checkpoint_interval_s"] == "auto":
        lines.append(storage.describe_intervals(runs.values()))
    return lines


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


def describe_sharing(packs: dict[str, Pack]) -> str:
    """The pack line's part on MPS-shared packs (pack.per_gpu), empty without them."""
    shared = [p for p in packs.values() if p.kind == "mps"]
    if not shared:
        return ""
    per_gpu, largest = shared[0].per_gpu, max(len(p.members) for p in shared)
    return (f"; {len(shared)} GPU pack(s) share each GPU between {per_gpu} members through "
            f"one private MPS daemon per node (a pack of {largest} asks gres=gpu:"
            f"{mps_gpus(largest, per_gpu)}; one Slurm step holds the node's GPUs and starts "
            "the members)")
