"""GPU jobs against what a site gives: one MIG slice a job (Alliance), and cores and memory
per GPU within a GPU node's share, at `snakemake -n`, from the plan's job shapes
(packs.job_shapes) and the partitions Slurm describes (partitions.read_partitions). No torch."""

from __future__ import annotations

import re


# a MIG instance's name: <profile>g.<memory>gb, after the GPU's (a100_3g.20gb on Narval)
MIG_SLICE = re.compile(r"(?:^|_)\d+g\.\d+gb$", re.IGNORECASE)


def job_gpus(shape: dict) -> int:
    """GPUs one job of this shape asks, all nodes together."""
    if shape.get("gpus_per_task"):
        return shape["gpus_per_task"] * shape["tasks"]
    return shape.get("gpus_per_node", 0) * shape.get("nodes", 1)


def gpu_slice_errors(shapes: dict[str, dict]) -> list[str]:
    """Jobs asking for more than one MIG slice: Alliance refuses them (one instance per
    job), and a process sees one instance anyway. One line, with the way out for small
    models."""
    over = [(job, s) for job, s in shapes.items()
            if MIG_SLICE.search(s.get("gpu_model") or "") and job_gpus(s) > 1]
    if not over:
        return []
    job, shape = over[0]
    more = f" (and {len(over) - 1} more job(s))" if len(over) > 1 else ""
    return [f"resources.gpu_model {shape['gpu_model']} is a MIG slice, and a job gets one "
            f"slice (a process sees one anyway), but {job} asks {job_gpus(shape)}{more}: "
            "train each run on one slice (strategy gpu, distributed.world_size 1), several "
            "small runs on it with pack.fuse or pack.per_gpu (MPS), or ask for whole GPUs "
            "(a gpu_model without a slice)"]


def gpu_share_warnings(shapes: dict[str, dict], places: list[dict]) -> list[str]:
    """GPU jobs asking more cores or memory per GPU than a GPU node's share (its cores or
    memory over its GPUs) in the partitions they may run in (routing.candidates): such a
    job strands the node's other GPUs, and sites bill it as more GPUs. 4 ranks x 12 cores
    on a 48-core 4-GPU node is fine; 16 cores for one GPU there is not."""
    gpu_nodes = [n for p in places or [] for n in p["nodes"] if n["gpus"]]
    if not gpu_nodes:
        return []
    names = ", ".join(p["name"] for p in places if any(n["gpus"] for n in p["nodes"]))
    cores_share = max(n["cpus"] / n["gpus"] for n in gpu_nodes)
    mem_share = max(n["mem_mb"] / n["gpus"] for n in gpu_nodes)
    warnings, seen = [], set()
    for job, shape in shapes.items():
        gpus = job_gpus(shape)
        if not gpus:
            continue
        cores = shape["tasks"] * shape["cpus_per_task"] / gpus
        mem = (shape["mem_per_cpu"] * shape["cpus_per_task"] * shape["tasks"]
               if shape.get("mem_per_cpu") else
               shape.get("mem_mb_per_node", 0) * shape.get("nodes", 1)) / gpus
        over = [f"{cores:g} cores" if cores > cores_share else "",
                f"{mem:,.0f} MB" if mem > mem_share else ""]
        over = [o for o in over if o]
        key = tuple(over)
        if over and key not in seen:  # one line per kind of excess: a sweep has many alike
            seen.add(key)
            warnings.append(
                f"{job} asks {' and '.join(over)} per GPU, more than a GPU's share of a node in "
                f"partition {names} ({cores_share:g} cores, "
                f"{mem_share:,.0f} MB): it strands the node's other GPUs and is billed as more "
                "GPUs; lower resources.cpus_per_task / mem_mb, or train on CPUs")
    return warnings
