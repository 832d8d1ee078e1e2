"""The workflow's plan, built once from the config where Snakemake reads the rules
(workflow/rules/common.smk wires it in through one-line ``get_*`` helpers): the runs and
the packs, and the collaborators that answer the rules, each given what it needs:

- ``software`` (software.py): a job's Python, its prologue, the job venvs;
- ``placement`` (placement.py): each job's partition and account;
- ``rounds`` (rounds.py): a search's trials, gated until their round is asked;
- ``outputs`` (outputs.py): the chains of segments and where they end, the runs file;
- ``run_rules`` (rules.py), ``pack_rules`` (pack_rules.py), ``search_rules`` (rounds.py):
  what each training rule and the ask rule ask, per job;
- ``checks`` (checks.py): the checks at `snakemake -n`, in the main process only.

Snakemake is not imported here: its checkpoints, its "not run yet" exception, its logger
and its error class are handed in, so the plan is built and tested without a workflow.
Functions a rule calls take Snakemake's arguments by name (``wildcards``, ``input``,
``attempt``, ``resources``, ``threads``, ``output``). No torch.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import time
from pathlib import Path
from typing import Callable

from ..config import data_identity, with_paths_expanded
from ..data import BATCHES_DIR
from ..data_folders import data_folder
from ..job.tries import INVOCATION
from .checks import PlanChecks
from .describe import plan_lines
from .outputs import Outputs
from .ownership import Ownership
from .pack_plan import Pack, plan_packs
from .packs import job_units
from .pack_rules import PackRules
from .pending import PendingWatch
from .placement import Placement
from .plan import PlanError, Run, build_runs, settle_keep_weights, sweep_item_schemas
from .progress import watch_progress
from .rounds import SearchRounds, SearchRules
from .rules import Requests, RunRules
from .search import Search
from .sites import current as current_site
from .software import JobSoftware, fetch_args
from .specs import write_specs
from .will_run import first_try

ENV_RECORD_RUNTIME = 10  # minutes: the environment record's job, at least


def name_pattern(strategies) -> str:
    """Run names are the strategy, or the strategy, '_' and the swept values (plan.py): a
    short constraint, where listing a sweep's thousand names would be matched per job."""
    return f"({'|'.join(map(re.escape, strategies))})(_[^/]+)?"


def pack_name_pattern(strategy: str) -> str:
    """The names build_packs gives a strategy's packs (a search's: per round)."""
    return f"{re.escape(strategy)}-(r\\d+-)?pack\\d+"


class WorkflowPlan:
    """Everything the rules ask of the config, computed once per Snakemake process. The
    collaborators share the plan's ``runs`` and ``packs`` (a search's later round adds to
    them in place: ``add_round``)."""

    def __init__(self, config: dict, basedir, runs: dict[str, Run], packs: dict[str, Pack], *,
                 checkpoints=None, pending: type[Exception] = LookupError,
                 error: type[Exception] = PlanError, log=logging.getLogger("cifarflow"),
                 jobs_at_once: int | None = None, environ=os.environ,
                 scripts_dir: str | None = None):
        self.config, self.runs, self.packs = config, runs, packs
        self.error, self.log, self.main_process = error, log, False
        self.results = config["results"]
        self.data_id = data_identity(config["data"])  # what shaped the data: its source
        self.data_dir = data_folder(self.results, self.data_id)  # results/data/<data id>
        self.batches = f"{self.data_dir}/{BATCHES_DIR}"
        self.fetch_args = fetch_args(config["data"])
        self.packed = sorted({pack.strategy for pack in packs.values()})
        self.unpacked = [s for s in config["strategies"] if s not in self.packed]
        self.software = JobSoftware(config, basedir, runs, jobs_at_once=jobs_at_once,
                                    error=error, log=log, scripts_dir=scripts_dir)
        self.placement = Placement(config["slurm"], environ, config["resources"]["gpu_model"])
        search = Search.from_sweep(config["sweep"], sweep_item_schemas())
        self.rounds = SearchRounds(search, config, runs, checkpoints, self.add_round, log, error)
        self.outputs = Outputs(config, runs, packs, checkpoints, pending=pending,
                               gate=self.rounds.gate, error=error)
        self.chain = self.outputs.chain
        requests = Requests(self.results, runs, log)
        self.run_rules = RunRules(runs, requests, self.placement, results=self.results,
                                  data=self.batches, stage=config["data"]["stage"],
                                  python=self.software.python)
        self.pack_rules = PackRules(runs, packs, self.chain, requests, self.placement, config,
                                    self.batches, error)
        self.search_rules = SearchRules(search, config["strategies"], self.outputs, log)
        self.checks = PlanChecks(config, runs, packs, self.placement,
                                 bool(self.software.env_gpu), jobs_at_once, log, error)

    @classmethod
    def from_config(cls, config: dict, basedir, **kw) -> "WorkflowPlan":
        """The plan of a schema-complete config; a config it cannot plan raises ``error``."""
        error = kw.get("error", PlanError)
        try:
            config = with_paths_expanded(config, kw.get("environ", os.environ))
            config = settle_keep_weights(config)  # the rounds of a search plan from it too
            runs = build_runs(config)
            packs = plan_packs(runs, config["pack"])
        except ValueError as exc:
            raise error(f"config error: {exc}")
        return cls(config, basedir, runs, packs, **kw)

    def runs_of(self, wildcards: dict) -> list[str]:
        """The runs a job trains, from its wildcards: its run, or its pack's members."""
        if "run" in wildcards:
            return [wildcards["run"]]
        if "pack" in wildcards:
            return self.chain.members(wildcards["pack"], int(wildcards["segment"]))
        return []

    def job_cancelled(self, job: str, rule: str, who: str, wildcards: dict) -> None:
        """A job cancelled from outside: recorded with the runs it trains (ownership.py)."""
        self.ownership.job_cancelled(job, rule, who, self.runs_of(wildcards))

    def start_main_process(self, workdir: str = ".", on_slurm: Callable[[], bool] = lambda: False,
                           training: Callable[[], bool] = lambda: False,
                           environ=os.environ) -> None:
        """What only the process that plans does (not every job again): mark this run of the
        workflow (which tries of a segment are its own), fix Snakemake, check the plan
        (checks.py, the jobs' software), write the run specs, say what the plan submits,
        watch for jobs pending forever while ``on_slurm()`` (it submits to Slurm, for real)
        and say how far the plan got while ``training()`` (not a dry run). Record the jobs
        it submits once it holds the lock, and cancel those left at its end (ownership.py)."""
        invocation = environ[INVOCATION] = f"{time.time():.0f}.{os.getpid()}"
        self.main_process = True  # a later search round's specs are written here too
        from .snakemake_fixes import (ask_the_scheduler_once, keep_restarted_jobs_ready,
                                      let_the_site_route, notice_outages_and_cancellations,
                                      start_jobs_quietly, tell_each_submission,
                                      tell_when_locked)
        from .limits import read_limits
        from .submit_room import SubmitRoom, share_the_submit_limit

        keep_restarted_jobs_ready()  # retried segments are not lost when a checkpoint finishes
        ask_the_scheduler_once()  # the plugin's constant questions, once
        start_jobs_quietly()  # and none from each job's Snakemake as it starts
        let_the_site_route()  # no -p <default partition> where the user named none
        self.ownership = Ownership(self.results, invocation, workdir, environ)
        self.ownership.replace_stale_lock(self.log.warning, replace=training())
        tell_when_locked(self.ownership.lock_taken)
        tell_each_submission(self.ownership.job_submitted)
        # an accounting outage keeps the jobs; a scancel from outside ends its run, no retry
        notice_outages_and_cancellations(self.log.warning, self.job_cancelled)
        # an sbatch refused for the user's submit limit waits for room, no try spent
        share_the_submit_limit(SubmitRoom(self.log.warning,
                                          lambda: (read_limits() or {}).get("max_submit")))
        self.checks.user_models()
        self.checks.results_dir()
        self.checks.kept_data(environ)
        write_specs(self.runs.values(), self.results, self.log)
        self.announce()
        self.software.check_strategy_packages()
        self.software.prepare_job_venvs()
        self.checks.against_cluster(jobs_of=self.first_jobs)
        self.checks.local_gpus(environ=environ)
        self.pending_watch = PendingWatch(self.ownership.submitted, self.log.warning,
                                          self.config["slurm"]["pending_check_s"],
                                          active=on_slurm).start()
        self.progress_watch = watch_progress(self.results, self.chain, self.log.info,
                                             self.config["progress_s"], training)
        # however it ends (all done, failed, Ctrl-C), none of its own jobs stays in the queue
        atexit.register(self.ownership.at_exit)

    def env_resources(self) -> dict:
        """The environment record's job: like the training's (a GPU of its kind where runs
        train on cuda), short: 10 minutes, or the site's minimum walltime (sites.py)."""
        return {**self.placement.job(self.software.env_gpu),
                "runtime": current_site().runtime_floor(ENV_RECORD_RUNTIME), "mem_mb": 2000}

    def first_jobs(self) -> list[tuple[str, dict, int, dict]]:
        """Every kind of job the plan submits, as its first try asks it: (label, the rule's
        resources resolved, threads, its shape for routing); what will_run asks Slurm."""
        env = self.env_resources()
        jobs = [("record_environment", env, 1,
                 {"tasks": 1, "cpus_per_task": 1, "mem_mb_per_node": env["mem_mb"],
                  "runtime": env["runtime"], "gpus_per_node": int(bool(self.software.env_gpu))})]
        for label, (kind, name), shape in job_units(self.runs, self.packs):
            if kind == "pack":
                rules, strategy = self.pack_rules, self.packs[name].strategy
                wildcards = {"pack": name, "segment": "1"}
            else:
                rules, strategy = self.run_rules, self.runs[name].strategy
                wildcards = {"run": name, "segment": "1"}
            resources = {key: first_try(value, wildcards)
                         for key, value in rules.resources(strategy).items()}
            jobs.append((label, resources, first_try(rules.threads(strategy), wildcards), shape))
        return jobs

    def announce(self) -> None:
        """Say what the plan submits: pruning, packing, the search, storage (describe.py)."""
        for line in plan_lines(self.config, self.runs, self.packs, self.rounds.describe(),
                               self.checks.storage):
            self.log.info(line)

    def add_round(self, new: dict[str, Run]) -> None:
        """A later search round's trials join the plan: packed (replacing the provisional
        packs of their placeholders), their specs written where the plan's are."""
        old = {p.name for p in self.packs.values() if set(p.members) & set(new)}
        self.runs.update(new)
        self.chain.add_packs(plan_packs(new, self.config["pack"]), old)
        if self.main_process:
            write_specs(new.values(), self.results, self.log)
