"""The workflow's plan, built once from the config where Snakemake reads the rules
(workflow/rules/common.smk wires it in through one-line ``get_*`` helpers): the runs, the
packs and their segment chains. Its concerns live beside it, each a part of WorkflowPlan:
main_process.py (the checks at `snakemake -n`, the specs, the watches), software.py (a
job's Python), rules.py (each segment job's command line and request), outputs.py (the
chains' outputs, the runs file), packs.py (how a pack trains, what it asks).

Snakemake is not imported here: its checkpoints, its "not run yet" exception, its logger
and its error class are handed in, so the plan is built and tested without a workflow.
Functions a rule calls take Snakemake's arguments by name (``wildcards``, ``input``,
``attempt``, ``resources``, ``threads``, ``output``). No torch.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import sysconfig
from pathlib import Path

from ..config import data_identity
from ..data_folders import data_folder
from ..orders import SegmentOrder
from .chain import Chain
from .main_process import MainProcess
from .outputs import Outputs
from .pack_plan import Pack, plan_packs
from .plan import PlanError, Run, build_runs, settle_keep_weights, sweep_item_schemas
from .rounds import SearchRounds
from .rules import SEGMENT_TRY, SegmentRules
from .search import Search
from .software import JobSoftware, installed_command


def slurm_placement(slurm: dict, environ=os.environ) -> dict:
    """slurm_account / slurm_partition for every job: config first, else the user's
    environment (SLURM_ACCOUNT, SLURM_PARTITION); absent means the cluster's default."""
    res = {}
    for key in ("account", "partition"):
        value = slurm[key] or environ.get(f"SLURM_{key.upper()}", "")
        if value:
            res[f"slurm_{key}"] = value
    if slurm["extra"]:
        res["slurm_extra"] = slurm["extra"]
    return res


def name_pattern(strategies) -> str:
    """Run names are the strategy, or the strategy, '_' and the swept values (plan.py): a
    short constraint, where listing a sweep's thousand names would be matched per job."""
    return f"({'|'.join(map(re.escape, strategies))})(_[^/]+)?"


def pack_name_pattern(strategy: str) -> str:
    """The names build_packs gives a strategy's packs (a search's: per round)."""
    return f"{re.escape(strategy)}-(r\\d+-)?pack\\d+"


class WorkflowPlan(MainProcess, JobSoftware, SegmentRules, Outputs, SearchRounds):
    """Everything the rules ask of the config, computed once per Snakemake process."""

    # the segment job's command line, a Snakemake shell template: the request comes from
    # `resources` (a retry changes it; params keep the first try's values)
    segment_command = ("{params.prologue}{params.launch} {params.cifarflow} "
                       + SegmentOrder.rule_command("{params.args}", **SEGMENT_TRY))

    def __init__(self, config: dict, basedir, runs: dict[str, Run], packs: dict[str, Pack], *,
                 checkpoints=None, pending: type[Exception] = LookupError,
                 error: type[Exception] = PlanError, log=logging.getLogger("cifarflow"),
                 jobs_at_once: int | None = None, environ=os.environ,
                 scripts_dir: str | None = None):
        self.config, self.basedir = config, Path(basedir)
        self.runs, self.packs = runs, packs
        self.checkpoints, self.error, self.log = checkpoints, error, log
        self.jobs_at_once = jobs_at_once
        self.results = config["results"]
        self.data_id = data_identity(config["data"])  # what shaped the data: its source
        self.data_dir = data_folder(self.results, self.data_id)  # results/data/<data id>
        self.batches = f"{self.data_dir}/cifar-10-batches-py"
        self.env = config["env"]
        self.job_requirements = self.job_requirements_file()
        self.python = sys.executable if self.env["mode"] == "current" else "python"
        # where snakemake runs (the local rules), and in jobs under env.mode current
        self.cifarflow = installed_command(scripts_dir or sysconfig.get_path("scripts"),
                                           self.basedir, error)
        self.job_cifarflow = self.job_command()
        self.prune = config["sweep"].get("prune")
        self.max_segments = config["segments"]["count"] + config["segments"]["max_extra"]
        self.packed = sorted({pack.strategy for pack in packs.values()})
        self.unpacked = [s for s in config["strategies"] if s not in self.packed]
        self.slurm_placement = slurm_placement(config["slurm"], environ)
        self.job_accounts: dict | None = None  # {on GPUs: account}: the main process's check
        self.env_gpu = self.env_gpu_request()
        self.chain = Chain(runs, packs, self.prune, self.max_segments, self.segment_output,
                           pending)
        self.sizing_logged: set = set()
        self.user_model_sizes: dict = {}  # measured at -n (check_user_models)
        self.init_search(Search.from_sweep(config["sweep"], sweep_item_schemas()))

    def placement(self, gpu: bool) -> dict:
        """slurm_placement, with the account a CPU or GPU job goes to where the main process
        settled it against sacctmgr (accounts.py: def-pi -> def-pi_cpu / def-pi_gpu)."""
        account = (self.job_accounts or {}).get(gpu)
        return {**self.slurm_placement, **({"slurm_account": account} if account else {})}

    @classmethod
    def from_config(cls, config: dict, basedir, **kw) -> "WorkflowPlan":
        """The plan of a schema-complete config; a config it cannot plan raises ``error``."""
        error = kw.get("error", PlanError)
        try:
            config = settle_keep_weights(config)  # the rounds of a search plan from it too
            runs = build_runs(config)
        except ValueError as exc:
            raise error(f"config error: {exc}")
        try:
            packs = plan_packs(runs, config["pack"])
        except ValueError as exc:
            raise error(f"config error: {exc}")
        return cls(config, basedir, runs, packs, **kw)
