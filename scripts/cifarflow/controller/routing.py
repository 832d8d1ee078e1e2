"""Which partitions a job may run in, and does it fit one? Each job of the plan (its shape
from packs.job_shapes, with its runtime) against the partitions Slurm describes
(partitions.read_partitions), at `snakemake -n`:

- slurm.partition named: that partition;
- else a partition marked Default=YES: that one (what Slurm gives a job naming none);
- else (or slurm.partition "default", which Alliance documents for "route it") the site
  routes each job (Alliance's submit plugin, by time limit and GPUs): every partition that
  is UP, not hidden and open to the job's account and the user's groups (AllowAccounts,
  DenyAccounts, AllowGroups); for a CPU job those with a node without GPUs, or all of them
  on a site where every node has a GPU. A job is accepted when one of them fits it (node fit, GPUs of
  its type, MaxTime); refused, naming their limits, when none does.

This is the plan's own reading of the partitions: Slurm itself is asked too (will_run.py,
sbatch --test-only), and where it answers, its answer wins. No torch here.
"""

from __future__ import annotations

import math

from .gpu_limits import job_gpus
from .partitions import (describe_partition, describe_shape, describe_time, may_use,
                         most_tasks)


ROUTE_IT = "default"  # slurm.partition: default, where no partition has that name


def routed(named: str, partitions: dict) -> bool:
    """No partition named: the site's routing (or its default partition) places each job."""
    return not named or named == ROUTE_IT and named not in partitions


def candidates(partitions: dict[str, dict], named: str, gpu: bool, account: str | None = None,
               groups: set[str] | None = None) -> tuple[list[dict], str]:
    """(the partitions a CPU or GPU job of this account may run in, how to name them)."""
    if not routed(named, partitions):
        return [partitions[named]] if named in partitions else [], f"partition {named}"
    default = [p for p in partitions.values() if p["default"]]
    if default:
        return default[:1], f"the default partition {default[0]['name']}"
    places = [p for p in partitions.values()
              if p["up"] and not p["hidden"] and may_use(p, account, groups)]
    if not gpu:  # CPU partitions, where the site has any; else (every node has a GPU) all
        places = [p for p in places if any(not n["gpus"] for n in p["nodes"])] or places
    return places, f"every partition a {'GPU' if gpu else 'CPU'} job can be routed to"


def describe_list(names: set[str] | None) -> str:
    return "ALL" if names is None else ",".join(sorted(names))


def describe_placement(partitions: dict[str, dict] | None, named: str) -> str:
    """The log line of where jobs go, with each partition's MaxTime."""
    if not partitions:
        return "partitions: no answer from Slurm here (scontrol show partition)"
    cpu, how = candidates(partitions, named, False)
    gpu, _ = candidates(partitions, named, True)
    if not routed(named, partitions) or len(cpu) == 1 and cpu == gpu and cpu[0]["default"]:
        return f"partitions: every job to {how}" + (f" ({describe_time(cpu[0])})" if cpu else "")
    return ("partitions: routed by the site (no slurm.partition, no default partition): CPU "
            f"jobs to one of {', '.join(map(describe_time, cpu)) or 'none'}; GPU jobs to one "
            f"of {', '.join(describe_time(p) for p in gpu if any(n['gpus'] for n in p['nodes'])) or 'none'}")


def unknown_partition(named: str, partitions: dict | None) -> str | None:
    """The refusal of a slurm.partition this cluster does not have; None where it has it."""
    if not partitions or routed(named, partitions) or named in partitions:
        return None
    shown = ", ".join(n for n, p in partitions.items() if not p["hidden"])
    return (f"slurm.partition {named} is not a partition of this cluster ({shown}): unset "
            "slurm.partition (and $SLURM_PARTITION) so the site places each job, or name one "
            "of those")


def check_fit(shapes: dict[str, dict], named: str, partitions: dict | None,
              accounts: dict | None = None, groups: set[str] | None = None) -> list[str]:
    """One error per kind of job that can never start where it may run, with the way out.
    `shapes` maps a job (a run or a pack) to its request: tasks, cpus_per_task, runtime,
    and where set nodes, tasks_per_node, mem_per_cpu, mem_mb_per_node, gpus_per_node,
    gpus_per_task, gpu_model, pack (members per job)."""
    if not partitions:
        return []
    unknown = unknown_partition(named, partitions)
    if unknown:
        return [unknown]
    errors = []
    for job, shape in alike(shapes):  # one error per request: a sweep has many alike
        error = job_error(job, shape, named, partitions, accounts, groups)
        if error and error not in errors:
            errors.append(error)
    return errors


def alike(shapes: dict[str, dict], key=lambda shape: repr(sorted(shape.items()))):
    """One (label, shape) per kind of job (by ``key``): the first job of the kind, named with
    how many more are alike, and its shape."""
    kinds: dict = {}
    for job, shape in shapes.items():
        kinds.setdefault(key(shape), []).append(job)
    return [(jobs[0] + (f" (and {len(jobs) - 1} more alike)" if len(jobs) > 1 else ""),
             shapes[jobs[0]]) for jobs in kinds.values()]


def job_error(job: str, shape: dict, named: str, partitions: dict, accounts: dict | None = None,
              groups: set[str] | None = None) -> str | None:
    """Why this job can run in none of its partitions; None where one fits it. ``accounts``:
    {on GPUs: the account its jobs go to}, where settled."""
    gpu = job_gpus(shape) > 0
    account = (accounts or {}).get(gpu)
    places, label = candidates(partitions, named, gpu, account, groups)
    if places and not routed(named, partitions) and not may_use(places[0], account, groups):
        return (f"partition {named} does not take jobs of account {account} or your groups "
                f"(AllowAccounts {describe_list(places[0]['allow_accounts'])}, AllowGroups "
                f"{describe_list(places[0]['allow_groups'])}): unset slurm.partition so the "
                "site places each job, or name a partition open to you")
    if not places:
        return (f"{job} has no partition to run in: {label} is none (every partition is "
                "down, hidden or closed to your account"
                + (f" {account}" if account else "") + "; scontrol show partition)")
    model = shape.get("gpu_model") or ""
    types = sorted({t for p in places for n in p["nodes"] for t in n["gpu_types"] if t})
    if gpu and model and model not in types:
        return (f"resources.gpu_model {model} is on no node of {label} "
                f"({', '.join(p['name'] for p in places)}), whose GPU types are "
                f"{', '.join(types) or 'untyped'}: sbatch would refuse every GPU job; set "
                f"resources.gpu_model to one of {', '.join(types)}, or any for any type")
    most = {p["name"]: most_tasks(shape, p) for p in places}
    fits = [p for p in places if most[p["name"]] >= shape["tasks"]]
    if not fits:
        return fit_error(job, shape, named, label, places, most, partitions)
    runtime = shape.get("runtime")
    limits = [p["max_time_min"] for p in fits]
    if not runtime or any(m is None or runtime <= m for m in limits):
        return None
    top = max(limits)
    above = (f"above partition {fits[0]['name']}'s MaxTime of {top:g} min" if len(fits) == 1
             else f"above {label.replace(' a ', ' this ')}: "
                  f"{', '.join(map(describe_time, fits))}")
    return (f"resources.runtime {runtime} min of {job} is {above}: set resources.runtime to at "
            f"most {math.floor(top)} (segments.count splits a run into more segments)"
            + (" or unset slurm.partition so the site routes it" if named else ""))


def fit_error(job, shape, named, label, places, most, partitions) -> str:
    """A job no partition it may run in can ever hold: what they give, and the way out."""
    best = max(most.values())
    ways = []
    if shape.get("pack") and best:
        ways.append(f"pack.runs_per_job: {best}")
    node_gpus = max((n["gpus"] for p in places for n in p["nodes"]), default=0)
    if shape.get("per_gpu") and node_gpus and not best:
        ways.append(f"pack.runs_per_job: {node_gpus * shape['per_gpu']} ({node_gpus} "
                    f"GPU(s) of a node x pack.per_gpu {shape['per_gpu']})")
    if shape.get("spread") and any(most_tasks({**shape, "nodes": None}, p) >= shape["tasks"]
                                   for p in places):
        ways.append(f"{shape['spread']} (Slurm spreads the members over nodes)")
    if shape["cpus_per_task"] > 1:
        ways.append("fewer resources.cpus_per_task")
    if len(places) == 1 and (named or places[0]["default"]):
        fit = sorted(n for n, p in partitions.items() if most_tasks(shape, p) >= shape["tasks"])
        ways.append(f"slurm.partition: {fit[0]} (it fits there)" if fit else "another partition")
        gives = (f"partition {places[0]['name']} can ever give one job {best} such task(s) "
                 f"({describe_partition(places[0])})")
    else:
        ways = ways or ["a smaller request (resources.mem_mb, distributed.world_size)"]
        gives = (f"{label} can ever give one job at most: "
                 + "; ".join(f"{p['name']} {most[p['name']]} ({describe_partition(p)})"
                             for p in places))
    return f"{job} asks {describe_shape(shape)}, and {gives}: it would wait forever; set " \
           + ", or ".join(ways)


def whole_node_notes(shapes: dict[str, dict], named: str, partitions: dict | None,
                     account: str | None = None) -> list[str]:
    """Where every partition a CPU job may run in gives whole nodes (OverSubscribe=
    EXCLUSIVE), a job holds a node and is billed for all of it: for each kind of CPU run or
    pack that leaves more than half a node idle, what one job costs and the pack that fills
    the node (a run uses all its tasks' CPUs; a pack's tasks are its members)."""
    if not partitions:
        return []
    places, label = candidates(partitions, named, False, account)
    if not places or not all(p["whole_node"] for p in places):
        return []
    node_cpus = min((n["cpus"] for p in places for n in p["nodes"]), default=0)

    def cpus(shape: dict) -> tuple[int, int]:  # (the job's, one run's)
        used = shape["tasks"] * shape["cpus_per_task"]
        return used, shape["cpus_per_task"] if shape.get("pack") else used

    # GPU jobs, and runs over several nodes, hold what they ask
    cpu_jobs = {job: shape for job, shape in shapes.items()
                if not job_gpus(shape) and (shape.get("nodes", 1) == 1 or shape.get("pack"))}
    notes = []
    for job, shape in alike(cpu_jobs, key=cpus):
        used, per_run = cpus(shape)
        if not node_cpus or used * 2 > node_cpus:
            continue  # half a node or more: packing gains little
        notes.append(f"{job}: {label} ({', '.join(p['name'] for p in places)}) gives whole "
                     f"nodes (OverSubscribe=EXCLUSIVE), so one job of {used} CPU(s) holds a "
                     f"{node_cpus}-CPU node and is billed for all of it ({used / node_cpus:.0%} "
                     f"used): pack.runs_per_job: {node_cpus // per_run} with pack.nodes: 1 and "
                     "pack.whole_node: true fills the node")
    return notes
