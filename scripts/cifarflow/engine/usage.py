"""What a segment used, next to what its job asked for (the request is the run's, known to
the workflow): CPU time and peak memory of every rank, wall time, the time the job waited
in Slurm's queue, the time its job venv took to build, and how the try ended."""

from __future__ import annotations

import resource
import socket

from .. import slurm
from ..jobfacts import env_build_s, job_fact


def peak_memory_mb(device: str) -> float:
    """This process's peak memory so far: the GPU's allocations on CUDA, else its RSS."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rank_usage() -> dict:
    """This process: CPU seconds (its own and its waited-for children's, e.g. DataLoader
    workers) and its peak resident memory (a forked child's peak counts the pages it
    shares with this process, so children's peaks are not added)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"host": socket.gethostname(),
            "cpu_s": own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime,
            "peak_rss_mb": own.ru_maxrss / 1024}  # KiB on Linux


def queue_wait_s() -> float | None:
    """Seconds between the job's submission and its start, as the job read them when it
    started (job_env)."""
    return job_fact("QUEUE_WAIT_S", slurm.job_queue_wait_s)


def ended_as(reason: str | None) -> str:
    if reason is None:
        return "completed"
    if reason == "time budget":
        return "stopped early (time budget)"
    return f"stopped early ({reason}: preempted, time limit or cancelled)"


def segment_usage(ranks: list[dict], wall_s: float, threads: int, reason: str | None) -> dict:
    """One try of a segment, all ranks together (memory summed, as the job holds it)."""
    per_node: dict[str, float] = {}
    for r in ranks:
        per_node[r["host"]] = per_node.get(r["host"], 0.0) + r["peak_rss_mb"]
    cpu_s = sum(r["cpu_s"] for r in ranks)
    return {"wall_s": wall_s, "cpu_s": cpu_s, "cpus": threads * len(ranks),
            "cpu_efficiency": cpu_s / (wall_s * threads * len(ranks)) if wall_s else None,
            "peak_rss_mb": sum(r["peak_rss_mb"] for r in ranks),
            "peak_rss_mb_per_node": per_node, "queue_wait_s": queue_wait_s(),
            "env_build_s": env_build_s(), "ended": ended_as(reason)}
