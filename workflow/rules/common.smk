import json
import os
import re
import shlex
import sys
import sysconfig
import time
from pathlib import Path

from snakemake.exceptions import IncompleteCheckpointException, WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

validate(config, schema="../schemas/config.schema.yaml")

# This checkout's engine, here and in every job, even where another checkout is the one
# installed (`pip install -e .`) or none is (the job venvs of env.mode slurm_tmpdir).
SCRIPTS = Path(workflow.basedir) / "scripts"
sys.path.insert(0, str(SCRIPTS))

from cifarflow.job_env import keep_slurm_job_values, prologue, put_engine_first  # noqa: E402

put_engine_first(SCRIPTS)
keep_slurm_job_values()

from cifarflow.tries import INVOCATION, out_of_memory_count  # noqa: E402

if workflow.is_main_process:  # which tries of a segment are this run of the workflow's
    os.environ[INVOCATION] = f"{time.time():.0f}.{os.getpid()}"

    from cifarflow.snakemake_fixes import keep_restarted_jobs_ready

    keep_restarted_jobs_ready()  # retried segments are not lost when a checkpoint finishes

from cifarflow.plan import build_packs, build_runs, check_user_models  # noqa: E402  (no torch)
from cifarflow.chain import Chain  # noqa: E402
from cifarflow.config import data_identity  # noqa: E402
from cifarflow.pending import PendingWatch  # noqa: E402
from cifarflow.layout import RunPaths, pack_marker, segment_number  # noqa: E402
from cifarflow.limits import (
    check_fit,
    check_plan,
    job_shapes,
    read_limits,
    read_partitions,
)  # noqa: E402
from cifarflow.strategies import get_strategy  # noqa: E402
from cifarflow.strategies.base import gpu_request  # noqa: E402

try:
    RUNS = build_runs(config)
    if workflow.is_main_process:  # not again in every job: it imports torch (seconds)
        check_user_models(RUNS.values())
except ValueError as exc:
    raise WorkflowError(f"config error: {exc}")

# The run's typed config, handed to every segment as one file (results/runs/<run>/spec.json),
# written here, where Snakemake plans, and only when it changed: its time stamp says when the
# run's config last changed (a job per run would cost one Snakemake start each).
if workflow.is_main_process:
    for _run in RUNS.values():
        _run.config.write(RunPaths(config["results"], _run.name).spec, only_if_changed=True)

PRUNE = config["sweep"].get("prune")
if PRUNE and workflow.is_main_process:
    logger.info(
        f"sweep.prune: the runs of each strategy are ranked on {PRUNE['metric']} after "
        f"segment(s) {', '.join(map(str, sorted(PRUNE['at_segments'])))}; the segments "
        "after a pruning point depend on that ranking and join the plan once it is known"
    )

RESULTS = config["results"]
DATA_DIR = f"{RESULTS}/data"
BATCHES = f"{DATA_DIR}/cifar-10-batches-py"
ENV = config["env"]
PYTHON = sys.executable if ENV["mode"] == "current" else "python"


def installed_command(bin_dir):
    """The `cifarflow` command of an environment, which must have this project installed."""
    command = Path(bin_dir, "cifarflow")
    if not command.exists():
        raise WorkflowError(
            f"{command} not found: install this project into that environment with "
            f"`pip install --no-deps -e {workflow.basedir}` (`make run` does it)"
        )
    return str(command)


def job_command():
    """The engine in jobs, after env_prologue. The venv of env.mode venv must have this
    project installed; the one env.mode slurm_tmpdir builds holds env.requirements alone,
    so the package comes from PYTHONPATH there."""
    if ENV["mode"] == "venv":
        installed_command(Path(ENV["venv"], "bin"))
        return "cifarflow"
    if ENV["mode"] == "slurm_tmpdir":
        return "python -m cifarflow"
    return CIFARFLOW


# where snakemake runs (the local rules), and in jobs under env.mode current
CIFARFLOW = installed_command(sysconfig.get_path("scripts"))
JOB_CIFARFLOW = job_command()
MAX_SEGMENTS = config["segments"]["count"] + config["segments"]["max_extra"]
PACKS = build_packs(RUNS, config["pack"]["runs_per_job"])
PACKED = sorted({pack.strategy for pack in PACKS.values()})
UNPACKED = [s for s in config["strategies"] if s not in PACKED]
if config["pack"]["runs_per_job"] > 1 and workflow.is_main_process:
    logger.info(
        f"pack: {sum(len(p.members) for p in PACKS.values())} runs of "
        f"{', '.join(PACKED) or 'no strategy'} in {len(PACKS)} packs of up to "
        f"{config['pack']['runs_per_job']}, one job per pack and segment"
        + (
            f"; {', '.join(UNPACKED)} (several processes per run): one job per run and segment"
            if UNPACKED
            else ""
        )
    )


def check_plan_against_cluster():
    """`snakemake -n` says what the plan submits and, where Slurm tells, whether it fits;
    refusals stop a run with --jobs (profiles/slurm), else they are warnings."""
    units = [p.members for p in PACKS.values()]
    units += [[name] for name, run in RUNS.items() if name not in CHAIN.pack_of]
    runtimes = {}
    for name, run in RUNS.items():
        runtimes.setdefault(run.resources["runtime"], []).append(name)
    segments = [len(RUNS[members[0]].segment_epochs) for members in units]
    partition = SLURM_PLACEMENT.get("slurm_partition", "")
    lines, errors = check_plan(
        len(RUNS),
        len(units),
        max(segments),
        sum(segments),
        runtimes,
        read_limits(partition),
        workflow.resource_settings.nodes,
    )
    errors += check_fit(job_shapes(RUNS, PACKS), partition, read_partitions())
    for line in lines:
        logger.info(line)
    if errors and workflow.resource_settings.nodes:
        raise WorkflowError("\n".join(errors))
    for error in errors:
        logger.warning(f"WARNING: {error} (a run through profiles/slurm stops here)")


def fetch_args():
    """fetch-data's options from config.data, the synthetic generator's included."""
    data = config["data"]
    args = ["--url", data["url"], "--md5", data["md5"], "--archive", data["archive"] or ""]
    args += ["--data-id", data_identity(data)]
    args += [f"--{key.replace('_', '-')}={value}" for key, value in data["synthetic"].items()]
    return shlex.join(args)


def env_prologue(nodes=1):
    """What gives a job its software (config.env): cifarflow/job_env.py."""
    return prologue(ENV, Path(workflow.basedir), nodes)


# Every try of a segment keeps its own log beside {log}, which Snakemake empties before a
# retry: segment-<k>.attempt<n>.log, plus .requeue<r> when Slurm requeued the same job.
KEEP_ATTEMPT_LOG = (
    "tee $(L={log}; R=${{CIFARFLOW_SLURM_RESTART_COUNT:-0}}; "
    "echo ${{L%.log}}.attempt{resources.attempt}$([ $R = 0 ] || echo .requeue$R).log) > {log}"
)


def slurm_placement():
    """slurm_account / slurm_partition for every job: config first, else the user's
    environment (SLURM_ACCOUNT, SLURM_PARTITION); absent means the cluster's default."""
    res = {}
    for key in ("account", "partition"):
        value = config["slurm"][key] or os.environ.get(f"SLURM_{key.upper()}", "")
        if value:
            res[f"slurm_{key}"] = value
    if config["slurm"]["extra"]:
        res["slurm_extra"] = config["slurm"]["extra"]
    return res


SLURM_PLACEMENT = slurm_placement()


def env_gpu_request():
    """One GPU of the kind the runs train on, for the environment check; {} if none does."""
    if not any(run.strategy_class.gpus_per_node(run.config) for run in RUNS.values()):
        return {}
    return gpu_request(config["resources"]["gpu_model"], 1)


ENV_GPU = env_gpu_request()


def run_name_pattern(strategies):
    """Run names are the strategy, or the strategy, '_' and the swept values (plan.py): a
    short constraint, where listing a sweep's thousand names would be matched per job."""
    return f"({'|'.join(map(re.escape, strategies))})(_[^/]+)?"


def run_dir(run):
    return f"{RESULTS}/runs/{run}"


def runs_of(strategy):
    return [name for name, run in RUNS.items() if run.strategy == strategy]


def segment_dir(run, segment):
    return f"{run_dir(run)}/segment-{segment}"


def previous_segment(wildcards):
    k = int(wildcards.segment)
    return segment_dir(wildcards.run, k - 1) if k > 1 else []


def train_params(wildcards):
    """Where this segment reads and writes; everything else is in the run's spec.json."""
    run = RUNS[wildcards.run]
    k = int(wildcards.segment)
    args = [
        "--data",
        BATCHES,
        "--out",
        segment_dir(run.name, k),
        "--work",
        f"{run_dir(run.name)}/work",
        "--until-epoch",
        str(run.until_epoch(k)),
        "--tensorboard",
        f"{RESULTS}/tensorboard/{run.name}",
        "--stage-data",
        config["data"]["stage"],
    ]
    if k > 1:
        args += ["--resume", segment_dir(run.name, k - 1)]
    return " ".join(shlex.quote(a) for a in args)


def resource_keys(strategy):
    """The scheduler resources a strategy's runs ask for (the same keys for all of them)."""
    return sorted({key for name in runs_of(strategy) for key in RUNS[name].resources})


def per_run(strategy, value_of):
    """An attribute of a training rule, as one constant where all runs of the strategy share it (Snakemake
    evaluates a function for every job, which a sweep of thousands of jobs feels), else
    a function of the run wildcard."""
    values = {name: value_of(RUNS[name]) for name in runs_of(strategy)}
    if len(set(map(repr, values.values()))) == 1:
        return next(iter(values.values()))
    return lambda wildcards: values[wildcards.run]


def get_threads(strategy):
    return per_run(strategy, lambda run: run.threads)


def get_prologue(strategy):
    return per_run(strategy, lambda run: env_prologue(run.config.nodes))


def get_launch_prefix(strategy):
    """What the training command starts under: the strategy's launcher and wrappers."""
    return per_run(strategy, lambda run: run.strategy_class.command_prefix(PYTHON, run))


SIZING_LOGGED = set()


def sized_request(runs, k, previous, attempt, name):
    """The request of segment k of `runs` (one, or a pack's members, who share one):
    the configured one, or from the previous segment's measurement (resources.autosize),
    with more memory after tries of this segment that ran out of it (retries only)."""
    first = RUNS[runs[0]]
    ooms = 0
    if attempt > 1:
        ooms = max(
            out_of_memory_count(
                RunPaths(RESULTS, run).root, k, logs_dir=RunPaths(RESULTS, run).logs
            )
            for run in runs
        )
    request = first.policy.request(previous, first.until_epoch(k), ooms)
    if request.why and (name, k, attempt) not in SIZING_LOGGED:
        SIZING_LOGGED.add((name, k, attempt))
        logger.info(f"{name} segment {k}: {request.why}")
    return request


def segment_request(key):
    """mem_mb or runtime of a segment job, sized (sized_request) once its input exists."""

    def value(wildcards, input, attempt):
        k = int(wildcards.segment)
        previous = [input.previous] if k > 1 and Path(input.previous).is_dir() else []
        return getattr(sized_request([wildcards.run], k, previous, attempt, wildcards.run), key)

    return value


def run_resources(strategy):
    """Rule resources, per run, plus `mpi`: its presence tells the Slurm jobstep not to
    wrap the command in an srun step of its own, since our launcher starts the step. Empty
    for one task (the plugin submits it as such; it refuses an mpi job of one task).
    Memory and runtime are sized per segment (segment_request)."""
    res = {
        key: per_run(strategy, lambda run, key=key: run.resources[key])
        for key in resource_keys(strategy)
    }
    res.update(mem_mb=segment_request("mem_mb"), runtime=segment_request("runtime"))
    res.update(SLURM_PLACEMENT)
    res["mpi"] = per_run(strategy, lambda run: "srun" if run.config.world_size > 1 else "")
    return res


def pack_name_pattern(strategy):
    return f"{re.escape(strategy)}-pack\\d+"


def pack_members(wildcards):
    """The runs a pack's segment job trains (all, but after pruning and in extra segments)."""
    return CHAIN.members(wildcards.pack, int(wildcards.segment))


def previous_pack_segment(wildcards):
    k = int(wildcards.segment)
    return pack_marker(RESULTS, wildcards.pack, k - 1) if k > 1 else []


def pack_specs(wildcards):
    return [RunPaths(RESULTS, run).spec for run in PACKS[wildcards.pack].members]


def pack_params(wildcards):
    """Where the pack's members read and write, and what each gets."""
    pack, k = PACKS[wildcards.pack], int(wildcards.segment)
    first = RUNS[pack.members[0]]  # the members share strategy, request and segment plan
    options = {
        "pack": pack.name,
        "segment": k,
        "results": RESULTS,
        "data": BATCHES,
        "until-epoch": first.until_epoch(k),
        "stage-data": config["data"]["stage"],
        "gpus": first.strategy_class.gpus_per_node(first.config),
    }
    args = [f"--{key}={value}" for key, value in options.items()]
    return shlex.join(args + ["--members", *pack_members(wildcards)])


def mem_per_cpu(member):
    return -(-int(member["mem_mb"]) // int(member["cpus_per_task"]))


def pack_resources(strategy):
    """The request of a pack's segment: one task per member it trains, each with the
    member's own cores, memory (per core, so members may spread over nodes) and GPU.
    `mpi` tells the Slurm plugin not to wrap the job in a step of its own: each member is
    one; empty for one member (the plugin refuses an mpi job of one task), which the
    jobstep still runs outside a step of its own."""

    def member(wildcards, key):
        return PACKS[wildcards.pack].member_resources[key]

    def tasks(wildcards):
        return len(pack_members(wildcards))

    def request(wildcards, input, attempt):
        """One member's, sized from all members' previous segments (sized_request)."""
        k, members = int(wildcards.segment), pack_members(wildcards)
        previous = [RunPaths(RESULTS, run).segment(k - 1) for run in members] if k > 1 else []
        return sized_request(members, k, previous, attempt, wildcards.pack)

    res = {
        "tasks": tasks,
        "cpus_per_task": lambda wildcards: member(wildcards, "cpus_per_task"),
        "mem_mb_per_cpu": lambda wildcards, input, attempt: mem_per_cpu(
            {
                "mem_mb": request(wildcards, input, attempt).mem_mb,
                "cpus_per_task": member(wildcards, "cpus_per_task"),
            }
        ),
        "runtime": lambda wildcards, input, attempt: request(wildcards, input, attempt).runtime,
        "mpi": lambda wildcards: "srun" if tasks(wildcards) > 1 else "",
    }
    if get_strategy(strategy).device_kind == "cuda":
        res["gres"] = lambda wildcards: gpu_request(
            config["resources"]["gpu_model"], tasks(wildcards)
        )["gres"]
        res["tasks_per_gpu"] = 0
        res["nodes"] = 1  # a pack's GPUs on one node
    res.update(SLURM_PLACEMENT)
    return res


def pack_threads(wildcards):
    """Cores the local scheduler reserves: the members' together."""
    return len(pack_members(wildcards)) * PACKS[wildcards.pack].member_resources["cpus_per_task"]


def segment_output(run, k):
    """Segment k of a run, once its job (its own, or its pack's) ran: until then an
    IncompleteCheckpointException, which schedules that job."""
    train_rule = getattr(checkpoints, f"train_{RUNS[run].strategy}")
    if run in CHAIN.pack_of:
        train_rule.get(pack=CHAIN.pack_of[run], segment=k)
        return RunPaths(RESULTS, run).segment(k)
    return train_rule.get(run=run, segment=k).output.ckpt


CHAIN = Chain(RUNS, PACKS, PRUNE, MAX_SEGMENTS, segment_output, IncompleteCheckpointException)
if workflow.is_main_process:
    check_plan_against_cluster()
if workflow.is_main_process:  # looks at squeue once Snakemake submits to Slurm
    PENDING_WATCH = PendingWatch(
        workflow.workdir_init,
        logger.warning,
        config["slurm"]["pending_check_s"],
        active=lambda: workflow.non_local_exec and not workflow.dryrun,
    ).start()


def final_segment(run):
    try:
        return CHAIN.final_segment(run)
    except ValueError as exc:
        raise WorkflowError(str(exc))


def final_metrics():
    """One input function per run: each waits on its own chain, so Snakemake schedules
    all runs at once (an unpack()ed function would wake them one at a time)."""
    return {run: (lambda wildcards, run=run: f"{final_segment(run)}/metrics.jsonl") for run in RUNS}


def existing_metrics():
    """The most advanced finished segment of each run that has one."""
    found = {}
    for name in RUNS:
        segments = sorted(
            Path(run_dir(name)).glob("segment-*/metrics.jsonl"),
            key=segment_number,
        )
        if segments:
            found[name] = str(segments[-1])
    return found


def write_runs_file(metrics, path):
    """What aggregation needs to know about each run, metrics path included: `metrics`
    maps run names to their last metrics.jsonl (rule input or what exists)."""
    metrics = {name: str(metrics[name]) for name in RUNS if name in metrics.keys()}
    runs = {
        name: {
            "strategy": run.strategy,
            "swept": run.swept,
            "spec": run.spec,
            "resources": run.resources,
            "segments": segment_number(metrics.get(name, "")),
            "metrics": metrics.get(name),
            "pruned_at": CHAIN.known_pruned_at(name),
            "planned_segments": len(run.segment_epochs),
            "logs": RunPaths(RESULTS, name).logs,
        }
        for name, run in RUNS.items()
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(runs, indent=1) + "\n")
