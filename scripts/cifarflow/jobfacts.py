"""What a Slurm job knows about itself, kept once per job and read by its processes: the
Slurm jobstep drops SLURM_* (but the job id) from what it runs, so the job's Snakemake keeps
the values as CIFARFLOW_SLURM_* (keep_slurm_job_values, from workflow/rules/common.smk),
and a training process reads them here (job_id, job_fact, env_build_s) without running a
Slurm command. Shared by every part; no torch here."""

from __future__ import annotations

import os

from . import slurm


def keep_slurm_job_values(environ=os.environ, times_of=slurm.job_times) -> None:
    """The Slurm jobstep drops SLURM_* (but the job id) from the environment of what it runs.
    The jobstep itself reads common.smk first, before that: keep the job's values that the
    job commands need as CIFARFLOW_SLURM_*, once per job. The job's end and its wait in the
    queue are asked here too, so that no rank runs a Slurm command (see job_fact)."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if job_id and job_id != environ.get("CIFARFLOW_SLURM_JOB_ID"):
        environ["CIFARFLOW_SLURM_JOB_ID"] = job_id
        for name in ("SLURM_TMPDIR", "SLURM_RESTART_COUNT", "SLURM_JOB_NUM_NODES"):
            environ[f"CIFARFLOW_{name}"] = environ.get(name, "")
        end, waited = times_of(job_id)  # one scontrol call per job
        facts = {"JOB_END_TIME": end, "QUEUE_WAIT_S": waited}
        for name, value in facts.items():
            environ[f"CIFARFLOW_SLURM_{name}"] = "" if value is None else repr(value)


def job_id(environ=os.environ) -> str:
    """This Slurm job's id, in a rank (srun sets it) or in a job command past the jobstep
    (kept above); "" outside Slurm."""
    return environ.get("SLURM_JOB_ID") or environ.get("CIFARFLOW_SLURM_JOB_ID", "")


def job_fact(name: str, ask, environ=os.environ) -> float | None:
    """A number about this Slurm job (JOB_END_TIME, QUEUE_WAIT_S) that keep_slurm_job_values
    asked when the job started; ``ask(job_id)`` only where it did not (a command started by
    hand in an allocation). None: no job, or no answer.

    Ranks run no Slurm command because a child spawned by a large process is counted as a
    copy of its memory until it execs, where the site gathers memory per process
    (jobacct_gather/linux), and a busy node's sampler can catch it: a rank whose peak was
    722 MB was counted at 1,422 MB while its squeue started, and killed over its 1,000 MB."""
    job = job_id(environ)
    if not job:
        return None
    kept = f"CIFARFLOW_SLURM_{name}"
    if environ.get("CIFARFLOW_SLURM_JOB_ID") == job and kept in environ:
        return float(environ[kept]) if environ[kept] else None
    return ask(job)


# a job venv (env.mode slurm_tmpdir) built in more than this share of its segment job is too
# dear: autosize asks for longer jobs (controller/sizing.py), the advice says so (results/)
ENV_BUILD_SHARE = 0.10


def env_build_s(environ=os.environ) -> float | None:
    """Seconds this job spent building its venv before the training started (the prologue
    of env.mode slurm_tmpdir; the nodes build at once), None where it built none."""
    value = environ.get("CIFARFLOW_ENV_BUILD_S", "")
    return float(value) if value else None
