"""A job's software: the engine first on its PYTHONPATH (called by workflow/rules/common.smk
at parse time, in the main process and again in every job), and the shell prologue that
gives it its Python per config.env (a clean module state and PYTHONPATH, module load, a
venv in $SLURM_TMPDIR built on every node, or one to activate). What a job keeps of Slurm's
values: cifarflow/jobfacts.py. No torch here."""

from __future__ import annotations

import os
import shlex
from pathlib import Path


def put_engine_first(engine_dir: Path, environ=os.environ) -> None:
    """Jobs import the engine of the workflow's own checkout: first on PYTHONPATH, ahead of
    an installed copy (`pip install -e .` of another checkout) and in job venvs that hold
    only env.requirements (env.mode slurm_tmpdir)."""
    entries = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if entries[:1] != [str(engine_dir)]:
        environ["PYTHONPATH"] = os.pathsep.join([str(engine_dir), *entries])


def pip_index_args(env: dict) -> list[str]:
    """pip's index options of a job venv (config.env): the cluster's wheelhouse only
    (--no-index; Alliance's pip config names it) and the user's own (--find-links)."""
    args = ["--no-index"] if env["pip_no_index"] else []
    return args + (["--find-links", env["find_links"]] if env["find_links"] else [])


# Lmod's `module` is a shell function, exported to jobs where the login shell has it: purge
# only where it exists (a cluster without modules has nothing to clean)
MODULE_PURGE = "if type module >/dev/null 2>&1; then module purge; fi"


def clean_start(env: dict, basedir: Path) -> list[str]:
    """A job's first lines: a clean module state (`module purge`, then env.modules, where
    modules are named) and a PYTHONPATH of the workflow's engine and env.pythonpath alone
    (--export=ALL hands jobs the login shell's: a loaded scipy-stack would shadow the job
    venv's numpy)."""
    lines = [MODULE_PURGE, f"module load {shlex.join(env['modules'])}"] if env["modules"] else []
    path = os.pathsep.join([str(Path(basedir) / "scripts"), *env["pythonpath"]])
    return lines + [f"export PYTHONPATH={shlex.quote(path)}"]


def prologue(env: dict, basedir: Path, requirements: Path) -> str:
    """Shell lines (each ending in ``&& ``) that give a job its software, from config.env:
    a clean start (clean_start), then the Alliance way is a venv in $SLURM_TMPDIR and
    `pip install --no-index` of ``requirements``, on every node the job holds (node_venv.sh:
    one srun task per node where there are several, whatever placed them: ddp over nodes, a
    pack Slurm spread). The build's wall time reaches the ranks as CIFARFLOW_ENV_BUILD_S
    (the segment's record)."""
    lines = clean_start(env, basedir)
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
