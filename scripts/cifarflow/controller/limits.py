"""Does the plan fit the cluster? What the plan submits, against what Slurm allows.

Read where Slurm tells (through ``slurm``): ``scontrol show config`` (MaxJobCount,
MaxArraySize, whether there is accounting), ``scontrol show partition`` (MaxTime), and with
accounting ``sacctmgr`` (MaxSubmitJobs of the user's association and QOS). A segment
runtime above the partition's MaxTime is an error with the way out; more jobs per round
than the submit limit suggests a pack size. Where Slurm says nothing, one line says so.
No torch here.
"""

from __future__ import annotations

import math
import re
import os

from .. import slurm


def slurm_minutes(text: str) -> float | None:
    """Slurm's time format ([days-]hours:minutes:seconds, minutes, ...) in minutes;
    None for UNLIMITED/INFINITE."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, rest = text.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        h, m, s = (parts + [0, 0])[:3]
        return float(days) * 1440 + h * 60 + m + s / 60
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:  # minutes:seconds
        return parts[0] + parts[1] / 60
    return parts[0] * 60 + parts[1] + parts[2] / 60


def read_limits(partition: str = "") -> dict | None:
    """What Slurm says of its limits; None where there is no Slurm client (or it does not
    answer)."""
    conf = slurm.cluster_config()
    if conf is None:
        return None
    limits = {"max_job_count": conf.get("MaxJobCount"), "max_array_size": conf.get("MaxArraySize"),
              "accounting": "none" not in conf.get("AccountingStorageType", "none")}
    record = slurm.partition(partition)
    limits["partition"] = record.get("PartitionName", partition or "?")
    limits["max_time_min"] = slurm_minutes(record["MaxTime"]) if record.get("MaxTime") else None
    limits["max_submit"] = None
    if limits["accounting"]:
        values = slurm.submit_limits(os.environ.get("USER", ""))
        limits["max_submit"] = min(values) if values else None
    return limits


def check_plan(runs: int, jobs_per_round: int, rounds: int, total_jobs: int, runtimes: dict,
               limits: dict | None, at_once: int | None) -> tuple[list[str], list[str]]:
    """(lines to log, errors) for a plan of `runs` runs in `jobs_per_round` segment jobs per
    round; `runtimes` maps each requested runtime (minutes) to the runs asking for it."""
    lines = [f"plan: {jobs_per_round} segment job(s) per round, {rounds} round(s), "
             f"{total_jobs} segment job(s) in all" + (f", at most {at_once} queued at once "
                                                     "(--jobs)" if at_once else "")]
    if limits is None:
        return lines + ["cluster limits: no answer from Slurm here (scontrol show config); "
                        "the plan is not checked against a cluster"], []
    errors = []
    max_time = limits["max_time_min"]
    told = [f"partition {limits['partition']} MaxTime "
            f"{'unlimited' if max_time is None else f'{max_time:g} min'}",
            f"MaxJobCount {limits['max_job_count'] or '?'}",
            f"MaxArraySize {limits['max_array_size'] or '?'}"]
    if max_time is not None:
        for runtime, names in sorted(runtimes.items()):
            if runtime > max_time:
                errors.append(
                    f"resources.runtime {runtime} min of {len(names)} run(s) (e.g. {names[0]}) is "
                    f"above partition {limits['partition']}'s MaxTime of {max_time:g} min: set "
                    f"resources.runtime to at most {math.floor(max_time)} (segments.count "
                    "splits a run into more segments) or choose another partition")
    limit = limits["max_submit"]
    if limit is None:
        told.append("MaxSubmitJobs: not set" if limits["accounting"] else
                    "MaxSubmitJobs: unknown (no accounting: sacctmgr says nothing)")
    else:
        told.append(f"MaxSubmitJobs {limit}")
        if at_once and at_once > limit:
            errors.append(f"--jobs {at_once} is above your MaxSubmitJobs of {limit}: sbatch "
                          f"would be refused; run with --jobs {limit} (profiles/slurm: jobs)")
        if jobs_per_round > limit:
            k = math.ceil(runs / limit)
            lines.append(f"a round has {jobs_per_round} jobs and the cluster queues at most "
                         f"{limit} of yours: pack.runs_per_job: {k} would submit a round at once")
    return lines + ["cluster limits: " + ", ".join(told)], errors


# ---- does each job fit what the partition can ever give?

def _number(text, default=None):
    return int(text) if str(text).isdigit() else default


def node_capacity(record: dict) -> dict:
    """What one node can ever give a job: CPUs, memory (MB), GPUs."""
    gpus = sum(int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", record.get("Gres", "")))
    return {"name": record.get("NodeName", "?"),
            "cpus": _number(record.get("CPUEfctv")) or _number(record.get("CPUTot"), 0),
            "mem_mb": _number(record.get("RealMemory"), 0), "gpus": gpus}


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
    """A partition as a job sees it: its nodes' capacities and its per-job limits."""
    names = set(expand_hostlist(partition.get("Nodes", "")))
    return {"name": partition.get("PartitionName", "?"),
            "nodes": [node_capacity(n) for n in nodes if n.get("NodeName") in names],
            "max_nodes": _number(partition.get("MaxNodes")),
            "max_cpus_per_node": _number(partition.get("MaxCPUsPerNode")),
            "max_mem_per_node": _number(partition.get("MaxMemPerNode"))}


def read_partitions(records=slurm.records) -> dict[str, dict] | None:
    """Every partition's capacity, by name (the default's as ''); None without Slurm."""
    partitions = records("partition")
    if not partitions:
        return None
    nodes = records("node")
    found = {p.get("PartitionName"): partition_capacity(p, nodes) for p in partitions}
    default = next((p["PartitionName"] for p in partitions if p.get("Default") == "YES"), None)
    if default:
        found[""] = found[default]
    return found


def tasks_on(node: dict, shape: dict, partition: dict) -> int:
    """How many of the job's tasks one node can ever hold."""
    cpus = min(node["cpus"], partition["max_cpus_per_node"] or node["cpus"])
    mem = min(node["mem_mb"], partition["max_mem_per_node"] or node["mem_mb"])
    fit = cpus // shape["cpus_per_task"]
    if shape.get("mem_per_cpu"):
        fit = min(fit, mem // (shape["mem_per_cpu"] * shape["cpus_per_task"]))
    if shape.get("gpus_per_task"):
        fit = min(fit, node["gpus"] // shape["gpus_per_task"])
    per_node = shape.get("tasks_per_node")
    if per_node:  # a fixed number per node, with the node's memory and GPUs for all of them
        ok = (fit >= per_node and mem >= shape.get("mem_mb_per_node", 0)
              and node["gpus"] >= shape.get("gpus_per_node", 0))
        return per_node if ok else 0
    if shape.get("mem_mb_per_node", 0) > mem or shape.get("gpus_per_node", 0) > node["gpus"]:
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
                      + (f" {n['gpus']} GPUs" if n["gpus"] else "") for n in partition["nodes"])
    return f"{len(partition['nodes'])} node(s): {nodes or 'none'}"


def check_fit(shapes: dict[str, dict], partition: str, partitions: dict | None) -> list[str]:
    """One error per job that can never start in the partition, with the way out: a
    smaller pack, fewer cores, or a partition where it fits. `shapes` maps a job (a run or
    a pack) to its request: tasks, cpus_per_task, and where set nodes, tasks_per_node,
    mem_per_cpu, mem_mb_per_node, gpus_per_node, gpus_per_task, pack (members per job),
    spread (the key that lets a one-node pack spread over nodes)."""
    if not partitions or partition not in partitions:
        return []
    part, errors, alike = partitions[partition], [], {}
    for job, shape in shapes.items():  # one error per request: a sweep has many alike
        alike.setdefault(repr(sorted(shape.items())), []).append(job)
    for jobs in alike.values():
        job, shape = jobs[0], shapes[jobs[0]]
        if len(jobs) > 1:
            job += f" (and {len(jobs) - 1} more alike)"
        most = most_tasks(shape, part)
        if most >= shape["tasks"]:
            continue
        fits = sorted(name for name, p in partitions.items()
                      if name and most_tasks(shape, p) >= shape["tasks"])
        ways = []
        if shape.get("pack") and most:
            ways.append(f"pack.runs_per_job: {most}")
        node_gpus = max((n["gpus"] for n in part["nodes"]), default=0)
        if shape.get("per_gpu") and node_gpus and not most:
            ways.append(f"pack.runs_per_job: {node_gpus * shape['per_gpu']} ({node_gpus} "
                        f"GPU(s) of a node x pack.per_gpu {shape['per_gpu']})")
        if shape.get("spread") and most_tasks({**shape, "nodes": None}, part) >= shape["tasks"]:
            ways.append(f"{shape['spread']} (Slurm spreads the members over nodes)")
        if shape["cpus_per_task"] > 1:
            ways.append("fewer resources.cpus_per_task")
        ways.append(f"slurm.partition: {fits[0]} (it fits there)" if fits else
                    "another partition")
        errors.append(f"{job} asks {describe_shape(shape)}, and partition {part['name']} can "
                      f"ever give one job {most} such task(s) ({describe_partition(part)}): it "
                      f"would wait forever; set {', or '.join(ways)}")
    return errors
