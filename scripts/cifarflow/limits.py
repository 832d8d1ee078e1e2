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
import os

from . import slurm


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
        return lines + ["cluster limits: no Slurm client here (scontrol); the plan is not "
                        "checked against a cluster"], []
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
