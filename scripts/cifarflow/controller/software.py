"""A job's software, as the plan gives it: the cifarflow command a job runs, its prologue
(config.env), the job venvs' requirements and the wheelhouse check at plan time, the GPU
the environment record asks for. The WorkflowPlan's ``software``. No torch."""

from __future__ import annotations

import logging
import shlex
import sys
import sysconfig
from pathlib import Path

from ..config import data_identity
from ..engine.cuda import gpu_request
from ..job.job_env import pip_index_args, prologue
from .plan import PlanError
from .optional_packages import not_installed
from .wheelhouse import (CHECKS, CORE_STACK, JOB_REQUIREMENTS, WheelhouseError, check_wheelhouse,
                         installed_closure, job_requirements, training_stack, write_if_changed)

# what a job goes without where an optional package of its stack is not installed here
WITHOUT = {"tensorboard": "no TensorBoard curves", "nvidia-ml-py": "no GPU utilisation"}


def installed_command(bin_dir, basedir, error: type[Exception] = PlanError) -> str:
    """The `cifarflow` command of an environment, which must have this project installed."""
    command = Path(bin_dir, "cifarflow")
    if not command.exists():
        raise error(f"{command} not found: install this project into that environment with "
                    f"`pip install --no-deps -e {basedir}` (`make run` does it)")
    return str(command)


def fetch_args(data: dict) -> str:
    """fetch-data's options from config.data, the synthetic generator's included."""
    args = ["--url", data["url"], "--md5", data["md5"], "--archive", data["archive"] or ""]
    args += [f"--{key.replace('_', '-')}={value}" for key, value in data["synthetic"].items()]
    args += ["--data-id", data_identity(data)]
    return shlex.join(args)


class JobSoftware:
    """What gives the plan's jobs their Python (config.env), given the plan's runs (what
    they import, whether one trains on a GPU)."""

    def __init__(self, config: dict, basedir, runs: dict, *, jobs_at_once: int | None = None,
                 error: type[Exception] = PlanError, log=logging.getLogger("cifarflow"),
                 scripts_dir: str | None = None):
        self.env, self.basedir, self.runs = config["env"], Path(basedir), runs
        self.results, self.gpu_model = config["results"], config["resources"]["gpu_model"]
        self.jobs_at_once, self.error, self.log = jobs_at_once, error, log
        self.job_requirements = self.job_requirements_file()
        self.python = sys.executable if self.env["mode"] == "current" else "python"
        # where snakemake runs (the local rules), and in jobs under env.mode current
        self.cifarflow = installed_command(scripts_dir or sysconfig.get_path("scripts"),
                                           self.basedir, error)
        self.job_cifarflow = self.job_command()
        self.env_gpu = self.env_gpu_request()

    def job_command(self) -> str:
        """The engine in jobs, after the prologue. The venv of env.mode venv must have this
        project installed; the one env.mode slurm_tmpdir builds holds the job requirements
        alone, so the package comes from PYTHONPATH there."""
        if self.env["mode"] == "venv":
            installed_command(Path(self.env["venv"], "bin"), self.basedir, self.error)
            return "cifarflow"
        if self.env["mode"] == "slurm_tmpdir":
            return "python -m cifarflow"
        return self.cifarflow

    def env_prologue(self) -> str:
        """What gives a job its software (config.env), on every node the job holds:
        cifarflow/job/job_env.py."""
        return prologue(self.env, self.basedir, self.job_requirements)

    def job_requirements_file(self) -> Path:
        """What a job venv installs (env.mode slurm_tmpdir): the user's env.requirements
        (relative to the workflow), else the one prepare_job_venvs derives in results/."""
        if self.env["requirements"]:
            return self.basedir / self.env["requirements"]
        return Path(self.results, JOB_REQUIREMENTS).absolute()

    def check_strategy_packages(self, lacking=not_installed) -> None:
        """A run whose strategy imports an optional package (lightning) that the jobs'
        environment lacks is refused here, naming it, rather than failing in every job.
        env.mode venv: that venv; else this one (slurm_tmpdir's jobs pin its versions)."""
        prefix = self.env["venv"] if self.env["mode"] == "venv" else None
        classes = {run.strategy: run.strategy_class for run in self.runs.values()}
        for strategy, cls in sorted(classes.items()):
            for package in cls.packages:
                missing = lacking(package, prefix)
                if missing:
                    raise self.error(f"strategy {strategy} (config strategies): {missing}; or "
                                     f"take {strategy} out of strategies")

    def check_pip_index(self) -> None:
        """Compute nodes reach no package index: under profiles/slurm (--jobs), the job venvs
        of env.mode slurm_tmpdir must install from the wheelhouse alone, or every job hangs
        in pip while the dry run on the login node (which has internet) passes."""
        if self.env["mode"] == "slurm_tmpdir" and not self.env["pip_no_index"] and \
                self.jobs_at_once:
            raise self.error(
                "env.pip_no_index: false under profiles/slurm: compute nodes reach no package "
                "index, so every job would hang in pip. Keep env.pip_no_index: true (the "
                "site's wheelhouse) and put the wheels it lacks in a folder on a shared "
                "filesystem named by env.find_links")

    def prepare_job_venvs(self, installed=installed_closure, check=check_wheelhouse) -> None:
        """env.mode slurm_tmpdir, in the main process: write the job requirements (the login
        node's own versions of what the plan's runs import, unless the user names a file)
        and, with env.check_wheelhouse, refuse the plan here if the wheelhouse cannot give
        them: one pip dry run per new requirements digest, before any job is queued."""
        if self.env["mode"] != "slurm_tmpdir":
            return
        self.check_pip_index()
        if not self.env["requirements"]:
            stack = training_stack(self.runs.values())
            closure = installed(stack)
            absent = [name for name in stack if name not in closure]
            if set(absent) & set(CORE_STACK):
                raise self.error(f"env.mode slurm_tmpdir: the job venvs install the training "
                                 f"stack at this venv's versions, but {', '.join(absent)} "
                                 "is not installed here: pip install -r requirements.txt")
            for name in absent:  # optional, and the jobs can go without (checked: lightning)
                self.log.warning(f"WARNING: {name} is not installed here, so the job venvs go "
                                 f"without it: {WITHOUT.get(name, 'its feature is off')} "
                                 "(cifarflow install-optional)")
            if write_if_changed(self.job_requirements, job_requirements(closure)):
                self.log.info(f"job venvs install {len(closure)} distributions at this venv's "
                              f"versions ({', '.join(n for n in stack if n in closure)} and "
                              f"what they need): {self.job_requirements}")
        elif not self.job_requirements.is_file():
            raise self.error(f"env.requirements: {self.job_requirements} does not exist")
        if not self.env["check_wheelhouse"]:
            return
        index = pip_index_args(self.env)
        try:
            asked = check(self.job_requirements, index, Path(self.results, CHECKS))
        except WheelhouseError as exc:
            raise self.error(str(exc))
        if asked:
            self.log.info(f"the wheelhouse ({' '.join(index) or 'pip configuration'}) holds "
                          f"every job requirement (pip install --dry-run)")

    def env_gpu_request(self) -> dict:
        """One GPU of the kind the runs train on, for the environment check; {} if none does."""
        if not any(run.strategy_class.gpus_per_node(run.config) for run in self.runs.values()):
            return {}
        return gpu_request(self.gpu_model, 1)
