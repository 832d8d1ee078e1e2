"""What a partition can ever give one job, from ``scontrol -a -o show partition/node``
(through ``slurm``): its nodes' CPUs, memory and GPUs by type, its per-job limits and
MaxTime, whether it is up, hidden or the default. routing.py checks the plan's jobs
against them. No torch here."""

from __future__ import annotations

import os
import re

from .. import slurm

# typed or not, with or without the sockets' suffix: gpu:a100:2(S:0-1), gpu:2
GPU_GRES = re.compile(r"gpu(?::([^:,(]+))?:(\d+)")


def _number(text, default=None):
    return int(text) if str(text).isdigit() else default


def _listed(text, everyone=None):
    """A partition's AllowAccounts-like list: None where it is everyone (ALL, or unset),
    else the names."""
    if not text or text == "ALL" or text == "(null)":
        return everyone
    return set(text.split(","))


def may_use(partition: dict, account: str | None, groups: set[str] | None = None) -> bool:
    """Whether the user may submit to the partition (AllowAccounts, DenyAccounts,
    AllowGroups) with this account; an unknown account or group list: assumed yes."""
    allowed, denied = partition.get("allow_accounts"), partition.get("deny_accounts") or set()
    if account and (allowed is not None and account not in allowed or account in denied):
        return False
    groups_allowed = partition.get("allow_groups")
    return groups is None or groups_allowed is None or bool(groups & groups_allowed)


def user_groups() -> set[str]:
    """The names of this user's groups (a partition's AllowGroups)."""
    import grp

    names = set()
    for gid in os.getgroups():
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return names


def gpu_types(gres: str) -> dict[str, int]:
    """A node's GPUs by type ('' for untyped ones): gpu:a100:2,gpu:a100_3g.20gb:1 ->
    {'a100': 2, 'a100_3g.20gb': 1}."""
    found: dict[str, int] = {}
    for model, count in GPU_GRES.findall(gres or ""):
        found[model] = found.get(model, 0) + int(count)
    return found


def node_capacity(record: dict) -> dict:
    """What one node can ever give a job: CPUs, memory (MB), GPUs (all, and by type)."""
    types = gpu_types(record.get("Gres", ""))
    return {"name": record.get("NodeName", "?"),
            "cpus": _number(record.get("CPUEfctv")) or _number(record.get("CPUTot"), 0),
            "mem_mb": _number(record.get("RealMemory"), 0), "gpus": sum(types.values()),
            "gpu_types": types}


def node_gpus(node: dict, model: str = "") -> int:
    """The node's GPUs of this type; every GPU for an untyped request."""
    return node["gpus"] if not model else node["gpu_types"].get(model, 0)


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list (n[1-3,5],vm) as names."""
    names = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,]+)", text):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            names += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
    return names


def partition_capacity(partition: dict, nodes: list[dict]) -> dict:
    """A partition as a job sees it: its nodes' capacities, its per-job limits, and what
    routing reads (State, Hidden, Default, whether every node has GPUs)."""
    names = set(expand_hostlist(partition.get("Nodes", "")))
    members = [node_capacity(n) for n in nodes if n.get("NodeName") in names]
    return {"name": partition.get("PartitionName", "?"), "nodes": members,
            "max_nodes": _number(partition.get("MaxNodes")),
            "max_cpus_per_node": _number(partition.get("MaxCPUsPerNode")),
            "max_mem_per_node": _number(partition.get("MaxMemPerNode")),
            "max_time_min": slurm.minutes(partition.get("MaxTime", "")),
            "up": partition.get("State", "UP") == "UP",
            "hidden": partition.get("Hidden") == "YES",
            "default": partition.get("Default") == "YES",
            "allow_accounts": _listed(partition.get("AllowAccounts")),
            "deny_accounts": _listed(partition.get("DenyAccounts"), everyone=set()),
            "allow_groups": _listed(partition.get("AllowGroups")),
            "allow_qos": _listed(partition.get("AllowQos")),
            # every job gets whole nodes, billed whole (Trillium's CPU partition)
            "whole_node": partition.get("OverSubscribe", "").startswith("EXCLUSIVE")}


def read_partitions(records=slurm.records) -> dict[str, dict] | None:
    """Every partition's capacity, by name, hidden ones too; None without Slurm."""
    partitions = records("partition")
    if not partitions:
        return None
    nodes = records("node")
    return {p.get("PartitionName"): partition_capacity(p, nodes) for p in partitions}


def tasks_on(node: dict, shape: dict, partition: dict) -> int:
    """How many of the job's tasks one node can ever hold (its GPUs of the asked type)."""
    cpus = min(node["cpus"], partition["max_cpus_per_node"] or node["cpus"])
    mem = min(node["mem_mb"], partition["max_mem_per_node"] or node["mem_mb"])
    gpus = node_gpus(node, shape.get("gpu_model") or "")
    fit = cpus // shape["cpus_per_task"]
    if shape.get("mem_per_cpu"):
        fit = min(fit, mem // (shape["mem_per_cpu"] * shape["cpus_per_task"]))
    if shape.get("gpus_per_task"):
        fit = min(fit, gpus // shape["gpus_per_task"])
    per_node = shape.get("tasks_per_node")
    if per_node:  # a fixed number per node, with the node's memory and GPUs for all of them
        ok = (fit >= per_node and mem >= shape.get("mem_mb_per_node", 0)
              and gpus >= shape.get("gpus_per_node", 0))
        return per_node if ok else 0
    if shape.get("mem_mb_per_node", 0) > mem or shape.get("gpus_per_node", 0) > gpus:
        return 0
    return fit


def most_tasks(shape: dict, partition: dict) -> int:
    """The most tasks of this shape one job can ever get in the partition."""
    per_node = sorted((tasks_on(n, shape, partition) for n in partition["nodes"]), reverse=True)
    if not per_node:
        return 0
    nodes = min(x for x in (shape.get("nodes"), partition["max_nodes"], len(per_node)) if x)
    if shape.get("nodes") and sum(1 for t in per_node if t) < shape["nodes"]:
        return 0
    return sum(per_node[:nodes]) if per_node else 0


def describe_shape(shape: dict) -> str:
    parts = [f"{shape['tasks']} task(s) of {shape['cpus_per_task']} CPU(s)"]
    if shape.get("nodes"):
        parts.append(f"on {shape['nodes']} node(s)")
    if shape.get("mem_per_cpu"):
        parts.append(f"{shape['mem_per_cpu']} MB per CPU")
    if shape.get("mem_mb_per_node"):
        parts.append(f"{shape['mem_mb_per_node']} MB per node")
    if shape.get("gpus_per_node"):
        parts.append(f"{shape['gpus_per_node']} GPU(s) per node")
    return ", ".join(parts)


def describe_partition(partition: dict) -> str:
    nodes = ", ".join(f"{n['name']} {n['cpus']} CPUs {n['mem_mb']} MB"
                      + (f" {describe_gpus(n)}" if n["gpus"] else "") for n in partition["nodes"])
    return f"{len(partition['nodes'])} node(s): {nodes or 'none'}"


def describe_gpus(node: dict) -> str:
    """2 GPUs (untyped), or the types: GPUs a100:2,a100_3g.20gb:1."""
    types = node["gpu_types"]
    if set(types) <= {""}:
        return f"{node['gpus']} GPUs"
    return "GPUs " + ",".join(f"{model or 'untyped'}:{n}" for model, n in types.items())


def describe_time(partition: dict) -> str:
    minutes = partition["max_time_min"]
    return f"{partition['name']} MaxTime {'unlimited' if minutes is None else f'{minutes:g} min'}"
