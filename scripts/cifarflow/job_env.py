"""What the workflow's jobs inherit from the Snakemake process that plans them (locally, and
through sbatch --export=ALL on a cluster). Called by workflow/rules/common.smk at parse
time, in the main process and again in every job. No torch here."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from . import slurm


def put_engine_first(engine_dir: Path, environ=os.environ) -> None:
    """Jobs import the engine of the workflow's own checkout: first on PYTHONPATH, ahead of
    an installed copy (`pip install -e .` of another checkout) and in job venvs that hold
    only env.requirements (env.mode slurm_tmpdir)."""
    entries = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if entries[:1] != [str(engine_dir)]:
        environ["PYTHONPATH"] = os.pathsep.join([str(engine_dir), *entries])


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
        end, waited = times_of(job_id)  # one squeue call per job
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


def pip_index_args(env: dict) -> list[str]:
    """pip's index options of a job venv (config.env): the cluster's wheelhouse only
    (--no-index; Alliance's pip config names it) and the user's own (--find-links)."""
    args = ["--no-index"] if env["pip_no_index"] else []
    return args + (["--find-links", env["find_links"]] if env["find_links"] else [])


def prologue(env: dict, basedir: Path, requirements: Path) -> str:
    """Shell lines (each ending in ``&& ``) that give a job its software, from config.env:
    the Alliance way is `module load`, a venv in $SLURM_TMPDIR and `pip install --no-index`
    of ``requirements``, on every node the job holds (node_venv.sh: one srun task per node
    where there are several, whatever placed them: ddp over nodes, a pack Slurm spread).
    The build's wall time reaches the ranks as CIFARFLOW_ENV_BUILD_S (the segment's record)."""
    lines = [f"module load {' '.join(env['modules'])}"] if env["modules"] else []
    if env["mode"] == "slurm_tmpdir":
        build = shlex.join([str(Path(basedir) / "workflow/scripts/node_venv.sh"),
                            str(requirements), *pip_index_args(env)])
        lines += ['export JOB_VENV="${CIFARFLOW_SLURM_TMPDIR:-${TMPDIR:-/tmp}/cifarflow.$SLURM_JOB_ID}/env"',
                  "build_start=$SECONDS", build,
                  "export CIFARFLOW_ENV_BUILD_S=$((SECONDS - build_start))",
                  'source "$JOB_VENV/bin/activate"']
    elif env["mode"] == "venv":
        lines += [f"source {shlex.quote(env['venv'])}/bin/activate"]
    return "".join(f"{line} && " for line in lines)


def env_build_s(environ=os.environ) -> float | None:
    """Seconds this job spent building its venv before the training started (the prologue
    of env.mode slurm_tmpdir; the nodes build at once), None where it built none."""
    value = environ.get("CIFARFLOW_ENV_BUILD_S", "")
    return float(value) if value else None
