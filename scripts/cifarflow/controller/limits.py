"""Does the plan fit the cluster's counts? What the plan submits, against what Slurm allows.

Read where Slurm tells (through ``slurm``, once a process): ``scontrol show config``
(MaxJobCount, MaxArraySize, whether there is accounting), and with accounting
``sacctmgr`` (MaxSubmitJobs of the user's association and QOS). More jobs at once than
the submit limit is an error with the way out; more jobs per round suggests a pack size.
Where each job may run (partitions, MaxTime, GPU types) is routing.py's. Where Slurm says
nothing, one line says so. No torch here.
"""

from __future__ import annotations

import math

from .. import slurm


def read_limits() -> dict | None:
    """What Slurm says of its limits; None where there is no Slurm client (or it does not
    answer)."""
    conf = slurm.cluster_config()
    if conf is None:
        return None
    limits = {"max_job_count": conf.get("MaxJobCount"), "max_array_size": conf.get("MaxArraySize"),
              "accounting": "none" not in conf.get("AccountingStorageType", "none")}
    limits["max_submit"] = None
    if limits["accounting"]:
        values = slurm.submit_limits(slurm.user())
        limits["max_submit"] = min(values) if values else None
    return limits


def check_plan(runs: int, jobs_per_round: int, rounds: int, total_jobs: int,
               limits: dict | None, at_once: int | None) -> tuple[list[str], list[str]]:
    """(lines to log, errors) for a plan of `runs` runs in `jobs_per_round` segment jobs per
    round."""
    lines = [f"plan: {jobs_per_round} segment job(s) per round, {rounds} round(s), "
             f"{total_jobs} segment job(s) in all" + (f", at most {at_once} queued at once "
                                                     "(--jobs)" if at_once else "")]
    if limits is None:
        return lines + ["cluster limits: no answer from Slurm here (scontrol show config); "
                        "the plan is not checked against a cluster"], []
    errors = []
    told = [f"MaxJobCount {limits['max_job_count'] or '?'}",
            f"MaxArraySize {limits['max_array_size'] or '?'}"]
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
