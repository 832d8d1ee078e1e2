"""What each run used, as Slurm's accounting tells it (`sacct`, slurm.job_accounting): CPU
efficiency, peak memory and runtime of its jobs, in place of the engine's own measurement
where sacct answers; the measurement stays beside them as a cross-check. Parsing is pure
(sacct's text in, numbers out). No torch."""

from __future__ import annotations

import re
from collections import Counter

from .. import slurm

# sacct's size suffixes, in MB (a bare number is in its base unit, KB)
SIZE_MB = {"": 1 / 1024, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2,
           "P": 1024.0 ** 3}
# what sacct replaces, and the column that keeps the engine's measurement
MEASURED = {"cpu_efficiency": "cpu_efficiency_measured", "mem_used_mb": "mem_used_measured_mb",
            "runtime_used_min": "runtime_used_measured_min"}


def duration_s(text: str) -> float | None:
    """sacct's [DD-][HH:]MM:SS[.fff] (Elapsed, TotalCPU, Timelimit) in seconds (Slurm's time
    format: slurm.minutes); None for UNLIMITED, INVALID, Partition_Limit or an empty field."""
    found = slurm.minutes(text)
    return None if found is None else found * 60


def size_mb(text: str) -> float | None:
    """sacct's sizes (MaxRSS 218200K, ReqMem 1000M or 4G; a trailing n/c of older releases,
    per node or per CPU, is dropped) in MB; None for an empty field."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTP]?)[nc]?", text.strip())
    return float(found[1]) * SIZE_MB[found[2]] if found else None


def parse_sacct(text: str) -> dict[str, dict]:
    """`sacct -P -n -o slurm.ACCOUNTING_FIELDS` lines, by job id: the job's own line
    ("job") and its steps' ("steps": batch, extern, 0, 1, ...)."""
    jobs: dict[str, dict] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 10:
            continue
        raw, name, elapsed, cpu, cpus, rss, req_mem, limit, state, tasks = parts[:10]
        job, _, step = raw.partition(".")
        record = {"name": name, "elapsed_s": duration_s(elapsed) or 0.0,
                  "cpu_s": duration_s(cpu) or 0.0, "cpus": int(cpus or 0),
                  "max_rss_mb": size_mb(rss), "req_mem_mb": size_mb(req_mem),
                  "limit_s": duration_s(limit), "state": (state.split() or [""])[0],
                  "tasks": int(tasks) if tasks.isdigit() else 1}
        entry = jobs.setdefault(job, {"job": None, "steps": []})
        if step:
            entry["steps"].append({**record, "step": step})
        else:
            entry["job"] = record
    return jobs


def run_usage(jobs: dict[str, dict], job_ids: list[str], run: str,
              shared: set[str] = frozenset()) -> dict | None:
    """A run's use of its jobs, as sacct tells it; None where sacct knows none of them.
    A GPU pack's job trains each member in a step named after it (job/members.py): a member
    counts its own steps; a run alone its whole job. A job in ``shared`` trains several runs
    in its steps together (a CPU pack's one step, a task per member: job/pack_step.py; a
    fused pack's one process): each member counts the whole job's CPU, and as its memory
    the largest task's (MaxRSS), not the tasks' sum. CPU efficiency: CPU time over cores x
    elapsed; memory: the largest step's MaxRSS (its largest task's) x its tasks, ``extern``
    aside; runtime: the longest job (a member's: its longest step)."""
    found = [(j, jobs[j]) for j in job_ids if jobs.get(j, {}).get("job")]
    if not found:
        return None
    cpu_s = core_s = 0.0
    peaks, longest = [], []
    for job_id, job in found:
        own = [s for s in job["steps"] if s["name"] == run]
        for part in own or [job["job"]]:
            cpu_s += part["cpu_s"]
            core_s += part["elapsed_s"] * part["cpus"]
            longest.append(part["elapsed_s"])
        tasks_of = (lambda s: 1) if job_id in shared and not own else (lambda s: s["tasks"])
        peaks += [s["max_rss_mb"] * tasks_of(s) for s in own or job["steps"]
                  if s["max_rss_mb"] and s["step"] != "extern"]
    usage = {"usage_from": "sacct", "cpu_efficiency": cpu_s / core_s if core_s else None,
             "runtime_used_min": max(longest) / 60}
    if peaks:
        usage["mem_used_mb"] = max(peaks)
    return usage


def with_accounting(rows: list[dict], text: str | None) -> list[dict]:
    """The summary's rows with what sacct tells (``text``: slurm.job_accounting's answer,
    None where it gave none) in place of the measured figures, kept as ``*_measured``."""
    jobs = parse_sacct(text) if text else {}
    runs_of = Counter(j for row in rows for j in set(str(row.get("slurm_job_ids") or "").split()))
    shared = {job for job, runs in runs_of.items() if runs > 1}  # a pack's: several runs
    for row in rows:
        row.update({kept: row.get(key) for key, kept in MEASURED.items()})
        usage = run_usage(jobs, str(row.get("slurm_job_ids") or "").split(), row["run"],
                          shared)
        row.update(usage or {"usage_from": "measured" if row.get("mem_used_mb") is not None
                             else None})
    return rows
