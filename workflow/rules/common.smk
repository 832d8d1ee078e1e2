import sys
from pathlib import Path

from snakemake.exceptions import IncompleteCheckpointException, WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

# This checkout's engine, here and in every job, even where another checkout is the one
# installed (`pip install -e .`) or none is (the job venvs of env.mode slurm_tmpdir).
SCRIPTS = Path(workflow.basedir) / "scripts"
sys.path.insert(0, str(SCRIPTS))

from cifarflow.schema import schema, typed_like_schema  # noqa: E402

# --config hands nested values over as strings ('sweep={"lr": [0.1, 0.2]}'): typed first
config.update(typed_like_schema(dict(config), schema()))
validate(config, schema="../schemas/config.schema.yaml")

from cifarflow.controller.workflow import (
    WorkflowPlan,
    name_pattern,
    pack_name_pattern,
)  # noqa: E402
from cifarflow.job.job_env import put_engine_first  # noqa: E402
from cifarflow.jobfacts import keep_slurm_job_values  # noqa: E402
from cifarflow.layout import RunPaths, attempt_log_sink, pack_marker, round_record  # noqa: E402

put_engine_first(SCRIPTS)
keep_slurm_job_values()

# The plan (cifarflow/controller/workflow.py): runs, packs, chains, each job's command line
# and request.
PLAN = WorkflowPlan.from_config(
    config,
    workflow.basedir,
    checkpoints=checkpoints,
    pending=IncompleteCheckpointException,
    error=WorkflowError,
    log=logger,
    jobs_at_once=workflow.resource_settings.nodes,
)
if workflow.is_main_process:  # not in every job: specs, the user's models (torch), Slurm
    PLAN.start_main_process(
        workflow.workdir_init,
        on_slurm=lambda: workflow.non_local_exec and not workflow.dryrun,
        training=lambda: not workflow.dryrun,
    )

RESULTS = PLAN.results
RUN = RunPaths(RESULTS, "{run}")  # a run's files, as wildcard patterns
KEEP_ATTEMPT_LOG = attempt_log_sink()  # every try of a segment keeps its own log, once
ROUND_RECORD = round_record(RESULTS, "{study}", "{round}")  # a search round, as asked


def get_env_resources():
    return PLAN.env_resources()


def get_previous_segment(wildcards):
    return PLAN.run_rules.previous(wildcards)


def get_segment_args(wildcards):
    return PLAN.run_rules.args(wildcards)


def get_threads(strategy):
    return PLAN.run_rules.threads(strategy)


def get_launch_prefix(strategy):
    return PLAN.run_rules.launch_prefix(strategy)


def get_run_resources(strategy):
    return PLAN.run_rules.resources(strategy)


def get_previous_pack_segment(wildcards):
    return PLAN.pack_rules.previous(wildcards)


def get_pack_specs(wildcards):
    return PLAN.pack_rules.specs(wildcards)


def get_pack_threads(strategy):
    return PLAN.pack_rules.threads(strategy)


def get_pack_resources(strategy):
    return PLAN.pack_rules.resources(strategy)


def get_pack_args(strategy):
    return PLAN.pack_rules.args(strategy)


def get_pack_command(strategy):
    return PLAN.pack_rules.command(strategy)


def get_final_metrics():
    return PLAN.outputs.final_metrics()


def get_round_inputs():
    return PLAN.search_rules.inputs()


def get_study_pattern():
    return PLAN.search_rules.study_pattern()


def get_search_setting(key):
    return PLAN.search_rules.setting(key)


def get_study_records():
    return PLAN.search_rules.records()
