"""What the workflow's jobs inherit from the Snakemake process that plans them (locally, and
through sbatch --export=ALL on a cluster). Called by workflow/rules/common.smk at parse
time, in the main process and again in every job. No torch here."""

from __future__ import annotations

import os
from pathlib import Path


def put_engine_first(engine_dir: Path, environ=os.environ) -> None:
    """Jobs import the engine of the workflow's own checkout: first on PYTHONPATH, ahead of
    an installed copy (`pip install -e .` of another checkout) and in job venvs that hold
    only env.requirements (env.mode slurm_tmpdir)."""
    entries = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if entries[:1] != [str(engine_dir)]:
        environ["PYTHONPATH"] = os.pathsep.join([str(engine_dir), *entries])


def keep_slurm_job_values(environ=os.environ) -> None:
    """The Slurm jobstep drops SLURM_* (but the job id) from the environment of what it runs.
    The jobstep itself reads common.smk first, before that: keep the job's values that the
    job commands need as CIFARFLOW_SLURM_*, once per job."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if job_id and job_id != environ.get("CIFARFLOW_SLURM_JOB_ID"):
        environ["CIFARFLOW_SLURM_JOB_ID"] = job_id
        for name in ("SLURM_TMPDIR", "SLURM_RESTART_COUNT"):
            environ[f"CIFARFLOW_{name}"] = environ.get(name, "")
