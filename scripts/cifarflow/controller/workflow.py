"""The workflow's plan, built once from the config where Snakemake reads the rules
(workflow/rules/common.smk wires it in through one-line ``get_*`` helpers): the runs, the
packs and their segment chains, each segment job's command line and request, the job's
software, the runs file aggregation reads, and the check of the plan against the cluster.

Snakemake is not imported here: its checkpoints, its "not run yet" exception, its logger
and its error class are handed in, so the plan is built and tested without a workflow.
Functions a rule calls take Snakemake's arguments by name (``wildcards``, ``input``,
``attempt``, ``resources``, ``threads``, ``output``). No torch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shlex
import sys
import sysconfig
import time
from pathlib import Path
from typing import Callable

from . import storage
from .chain import Chain
from ..job.job_env import pip_index_args, prologue
from ..job.mps_daemon import mps_gpus
from ..layout import RunPaths, pack_marker, segment_number, try_args
from ..config import data_identity
from ..data import ARCHIVE_NAME, fetch_record
from ..engine.gpu_monitor import visible_gpus
from .limits import (check_fit, check_plan, gpu_share_warnings, gpu_slice_errors, read_limits,
                     read_partitions)
from .pending import PendingWatch
from .plan import (Pack, Run, build_packs, build_runs, check_user_models, describe_fusion,
                   fuse_mode, share_gpus)
from .progress import watch_progress
from ..engine.strategies import get_strategy
from ..engine.strategies.base import gpu_request
from ..engine.strategies.ddp import too_few_gpus
from ..job.tries import INVOCATION, out_of_memory_count
from .wheelhouse import (CHECKS, JOB_REQUIREMENTS, TRAINING_STACK, WheelhouseError,
                         check_wheelhouse, installed_closure, job_requirements, write_if_changed)


class PlanError(Exception):
    """A plan that cannot run; the workflow hands in Snakemake's WorkflowError instead."""


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


def mem_per_cpu(mem_mb: int, cpus: int) -> int:
    """Memory per core, rounded up: a member's memory may come to no less than it asked."""
    return -(-int(mem_mb) // int(cpus))


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


def name_pattern(strategies) -> str:
    """Run names are the strategy, or the strategy, '_' and the swept values (plan.py): a
    short constraint, where listing a sweep's thousand names would be matched per job."""
    return f"({'|'.join(map(re.escape, strategies))})(_[^/]+)?"


def pack_name_pattern(strategy: str) -> str:
    """The names build_packs gives a strategy's packs."""
    return f"{re.escape(strategy)}-pack\\d+"


def gres_model(resources: dict) -> str:
    """The GPU type a request names (gres gpu:<type>:<count>), "" where it names none."""
    parts = resources.get("gres", "").split(":")
    return parts[1] if len(parts) == 3 else ""


class StepPack:
    """The pack kind of pack.py (`cifarflow train-pack`): one task per member it trains, each
    a Slurm step with the member's own cores, memory (per core, so members may spread over
    nodes) and GPU, running the member's own `cifarflow train`; or, for a fused pack
    (``Pack.fuse``), one task that trains them all as one model (`cifarflow train-fused`):
    a member's cores, the members' memory together, one GPU. Another kind of pack is
    another class with these members, named by ``Pack.kind``."""

    # Snakemake's shell template: what a retry changes (the request) comes from `resources`
    # there, never from params, which Snakemake keeps from the first try
    command = ("{params.prologue}{params.cifarflow} train-pack {params.args}"
               " --threads {resources.cpus_per_task} --budget-min {resources.runtime}"
               " --mem-per-cpu {resources.mem_mb_per_cpu} --slots {threads}"
               " --record {output.record}")

    def args(self, plan: "WorkflowPlan", wildcards) -> str:
        """The pack's segment: which members, where they read and write."""
        pack, k = plan.packs[wildcards.pack], int(wildcards.segment)
        first = plan.runs[pack.members[0]]  # the members share strategy, request and plan
        options = {
            "pack": pack.name,
            "segment": k,
            "results": plan.results,
            "data": plan.batches,
            "until-epoch": first.until_epoch(k),
            "stage-data": plan.config["data"]["stage"],
            "gpus": first.strategy_class.gpus_per_node(first.config),
        }
        if pack.fuse:
            options["fuse"] = pack.fuse
        args = [f"--{key}={value}" for key, value in options.items()]
        return shlex.join(args + ["--members", *plan.pack_members(wildcards)])

    @staticmethod
    def task_count(pack: Pack, members: int) -> int:
        """One per member it trains; one for a fused pack."""
        return 1 if pack.fuse else members

    @staticmethod
    def task_mem_mb(pack: Pack, members: int, member_mem_mb: int) -> int:
        """A member's memory; a fused pack's one process: one member's (the runtime, the
        data, a model) and a share for each further member (pack.fuse_member_mem_mb), not
        every member's whole process again."""
        return member_mem_mb + (members - 1) * pack.member_share_mb if pack.fuse else member_mem_mb

    def gpus(self, pack: Pack, members: int) -> int:
        """GPUs of a GPU pack's job, all on one node: one a task."""
        return self.task_count(pack, members)

    def tasks(self, plan: "WorkflowPlan", wildcards) -> int:
        return self.task_count(plan.packs[wildcards.pack], len(plan.pack_members(wildcards)))

    def shape(self, pack: Pack, runs: dict[str, Run]) -> tuple[str, dict]:
        """What the pack's first segment asks (all its members), as limits.check_fit reads
        it, from the same counts as ``resources``."""
        res, members = pack.member_resources, len(pack.members)
        cpus = int(res["cpus_per_task"])
        shape = {"tasks": self.task_count(pack, members), "cpus_per_task": cpus,
                 "pack": not pack.fuse,
                 "mem_per_cpu": mem_per_cpu(self.task_mem_mb(pack, members, res["mem_mb"]), cpus)}
        if self.on_gpu(runs[pack.members[0]]):
            shape.update(nodes=1, gpus_per_task=1, gpu_model=gres_model(res))
        return f"pack {pack.name} ({members} runs)", shape

    @staticmethod
    def on_gpu(run: Run) -> bool:
        return run.strategy_class.gpus_per_node(run.config) > 0

    def threads(self, plan: "WorkflowPlan", wildcards) -> int:
        """Cores the local scheduler reserves: the members' together (a fused pack's one)."""
        pack = plan.packs[wildcards.pack]
        return self.tasks(plan, wildcards) * pack.member_resources["cpus_per_task"]

    def resources(self, plan: "WorkflowPlan", strategy: str) -> dict:
        """The request of a pack's segment. `mpi` tells the Slurm plugin not to wrap the job
        in a step of its own: each member is one; empty for one member (the plugin refuses
        an mpi job of one task), which the jobstep still runs outside a step of its own."""

        def cpus(wildcards):
            return plan.packs[wildcards.pack].member_resources["cpus_per_task"]

        def tasks(wildcards):
            return self.tasks(plan, wildcards)

        def task_mem_mb(wildcards, attempt):  # pack_request sizes a fused pack's whole process
            return plan.pack_request(wildcards, attempt).mem_mb

        res = {
            "tasks": tasks,
            "cpus_per_task": cpus,
            "mem_mb_per_cpu": lambda wildcards, input, attempt: mem_per_cpu(
                task_mem_mb(wildcards, attempt), cpus(wildcards)),
            "runtime": lambda wildcards, input, attempt: plan.pack_request(
                wildcards, attempt).runtime,
            "mpi": lambda wildcards: "srun" if tasks(wildcards) > 1 else "",
        }
        if get_strategy(strategy).device_kind == "cuda":
            model = plan.config["resources"]["gpu_model"]
            res["gres"] = lambda wildcards: gpu_request(model, self.gpus(
                plan.packs[wildcards.pack], len(plan.pack_members(wildcards))))["gres"]
            res["tasks_per_gpu"] = 0
            res["nodes"] = 1  # a pack's GPUs on one node
        return res


class MpsPack(StepPack):
    """A GPU pack whose members share each GPU (pack.per_gpu M, pack.py): the members' cores
    and memory as in StepPack, but G = ceil(members / M) GPUs, and ONE Slurm step holding the
    node's G GPUs (a step's GPU is its own) starts them under one private MPS daemon, M on
    each GPU."""

    def args(self, plan: "WorkflowPlan", wildcards) -> str:
        return f"--per-gpu={plan.packs[wildcards.pack].per_gpu} " + super().args(plan, wildcards)

    def gpus(self, pack: Pack, members: int) -> int:
        """One per ``per_gpu`` members."""
        return mps_gpus(members, pack.per_gpu)

    def shape(self, pack: Pack, runs: dict[str, Run]) -> tuple[str, dict]:
        _, shape = super().shape(pack, runs)
        shape.pop("gpus_per_task", None)  # all on one node: G GPUs for its M-per-GPU tasks
        shape.update(gpus_per_node=self.gpus(pack, len(pack.members)), per_gpu=pack.per_gpu)
        return f"pack {pack.name} ({len(pack.members)} runs, {pack.per_gpu} per GPU)", shape


PACK_KINDS = {"steps": StepPack(), "mps": MpsPack()}

# what a run's spec may change while its finished segments stand (segments.elastic)
ELASTIC_FIELDS = {"world_size", "nodes"}


def job_shapes(runs: dict[str, Run], packs: dict[str, Pack]) -> dict[str, dict]:
    """The request of every segment job of the plan (a pack's first segment, with all its
    members), as limits.check_fit reads it."""
    shapes, packed = {}, set()
    for pack in packs.values():
        label, shapes_of_pack = PACK_KINDS[pack.kind].shape(pack, runs)
        shapes[label] = shapes_of_pack
        packed.update(pack.members)
    for name, run in runs.items():
        if name in packed:
            continue
        res, nodes = run.resources, run.resources.get("nodes")
        tasks = int(res.get("tasks") or int(res.get("tasks_per_node", 1)) * (nodes or 1))
        shape = {"tasks": tasks, "cpus_per_task": int(res["cpus_per_task"]),
                 "mem_mb_per_node": int(res["mem_mb"]),
                 "gpus_per_node": run.strategy_class.gpus_per_node(run.config),
                 "gpu_model": gres_model(res)}
        if nodes:
            shape.update(nodes=int(nodes), tasks_per_node=tasks // int(nodes))
        shapes[f"run {name}"] = shape
    return shapes


class WorkflowPlan:
    """Everything the rules ask of the config, computed once per Snakemake process."""

    # the segment job's command line, a Snakemake shell template: the request comes from
    # `resources` (a retry changes it; params keep the first try's values)
    segment_command = ("{params.prologue}{params.launch} {params.cifarflow} train {params.args} "
                       + " ".join(try_args("{resources.cpus_per_task}", "{resources.runtime}",
                                           "{resources.mem_mb}", "{resources.attempt}")))

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
        self.data_dir = f"{self.results}/data"
        self.batches = f"{self.data_dir}/cifar-10-batches-py"
        self.data_id = data_identity(config["data"])  # what shaped the data: its source
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
        self.env_gpu = self.env_gpu_request()
        self.chain = Chain(runs, packs, self.prune, self.max_segments, self.segment_output,
                           pending)
        self.sizing_logged: set = set()

    @classmethod
    def from_config(cls, config: dict, basedir, **kw) -> "WorkflowPlan":
        """The plan of a schema-complete config; a config it cannot plan raises ``error``."""
        error = kw.get("error", PlanError)
        try:
            runs = build_runs(config)
        except ValueError as exc:
            raise error(f"config error: {exc}")
        per_job, per_gpu = config["pack"]["runs_per_job"], config["pack"]["per_gpu"]
        try:
            packs = share_gpus(build_packs(runs, per_job, fuse_mode(config["pack"]["fuse"]),
                                           config["pack"]["fuse_member_mem_mb"]),
                               runs, per_gpu, per_job)
        except ValueError as exc:
            raise error(f"config error: {exc}")
        return cls(config, basedir, runs, packs, **kw)

    # ---- once, in the main process ------------------------------------------------------
    def start_main_process(self, workdir: str = ".", on_slurm: Callable[[], bool] = lambda: False,
                           training: Callable[[], bool] = lambda: False,
                           environ=os.environ) -> None:
        """What only the process that plans does (not every job again): mark this run of the
        workflow (which tries of a segment are its own), fix Snakemake, check the user's
        models (imports torch), write the run specs, say what the plan submits, watch for
        jobs pending forever while ``on_slurm()`` (it submits to Slurm, for real) and say
        how far the plan got while ``training()`` (not a dry run)."""
        environ[INVOCATION] = f"{time.time():.0f}.{os.getpid()}"
        from .snakemake_fixes import keep_restarted_jobs_ready

        keep_restarted_jobs_ready()  # retried segments are not lost when a checkpoint finishes
        try:
            check_user_models(self.runs.values())
        except ValueError as exc:
            raise self.error(f"config error: {exc}")
        self.check_kept_data()
        self.write_specs()
        self.announce()
        self.prepare_job_venvs()
        self.check_against_cluster()
        self.check_local_gpus(environ=environ)
        self.pending_watch = PendingWatch(workdir, self.log.warning,
                                          self.config["slurm"]["pending_check_s"],
                                          active=on_slurm).start()
        self.progress_watch = watch_progress(self.results, self.chain, self.log.info,
                                             self.config["progress_s"], training)

    def data_record(self) -> dict | None:
        """What fetch-data wrote of the data in results/data: source, data id, md5."""
        return fetch_record(Path(self.data_dir, ARCHIVE_NAME))

    def check_kept_data(self) -> None:
        """Real CIFAR-10 (downloaded, or from an archive) in results/data is never replaced by
        a synthetic set without a word: a plan that would do it is refused, with both ways out
        (a dry run says so too)."""
        record = self.data_record()
        if record and record["source"] != "synthetic" and self.config["data"]["source"] == "synthetic":
            raise self.error(
                f"{self.data_dir} holds CIFAR-10 (data.source {record['source']}, md5 "
                f"{record['md5']}), but the config says data.source: synthetic, which would "
                "replace it with a synthetic set. To train on it, set data.source: "
                f"{record['source']} in config/config.yaml (as when it was fetched); to replace "
                f"it on purpose, remove {self.data_dir} first")

    def write_specs(self) -> None:
        """The run's typed config, handed to every segment as one file (spec.json), written
        where Snakemake plans, and only when it changed: its time stamp says when the run's
        config last changed (a job per run would cost one Snakemake start each), so the
        finished segments are trained again. But a new world size under segments.elastic
        keeps the time stamp: the finished segments stand and the next resumes from them."""
        for run in self.runs.values():
            spec = Path(RunPaths(self.results, run.name).spec)
            old = spec.read_text() if spec.is_file() else None
            if old == run.config.to_json():
                continue  # its time stamp keeps saying when the config last changed
            stamp = spec.stat() if old else None
            run.config.write(spec)
            before, now = json.loads(old) if old else {}, run.config.to_dict()
            if not before or before.get("world_size") == now["world_size"]:
                continue
            changed = {key for key in now if before.get(key) != now[key]}
            resize = f"run {run.name}: world size {before['world_size']} -> {now['world_size']}"
            if run.config.elastic and changed <= ELASTIC_FIELDS:
                os.utime(spec, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
                self.log.info(f"{resize} (segments.elastic): its finished segments stand, the "
                              "next resumes from them at an epoch boundary")
            else:
                self.log.info(f"{resize}: the run is trained again from its first segment"
                              + ("" if run.config.elastic else
                                 " (segments.elastic: true would go on from the finished ones)"))

    def announce(self) -> None:
        """The log lines of pruning, packing and what the plan will store."""
        if self.prune:
            self.log.info(
                f"sweep.prune: the runs of each strategy are ranked on {self.prune['metric']} "
                f"after segment(s) {', '.join(map(str, sorted(self.prune['at_segments'])))}; "
                "the segments after a pruning point depend on that ranking and join the plan "
                "once it is known")
        per_job = self.config["pack"]["runs_per_job"]
        if per_job > 1:
            self.log.info(
                f"pack: {sum(len(p.members) for p in self.packs.values())} runs of "
                f"{', '.join(self.packed) or 'no strategy'} in {len(self.packs)} packs of up to "
                f"{per_job}, one job per pack and segment"
                + (f"; {', '.join(self.unpacked)} (several processes per run): one job per run "
                   "and segment" if self.unpacked else "") + self.describe_sharing())
        if self.config["pack"]["fuse"] and self.packs:
            self.log.info(describe_fusion(self.runs, self.packs))
        self.log.info(storage.describe(self.runs.values(), self.config["segments"]["keep_weights"]))

    def check_local_gpus(self, count_gpus=visible_gpus, environ=os.environ) -> None:
        """A local run (no --jobs: not profiles/slurm, and outside a Slurm job) whose runs ask
        more GPUs per node than this machine has stop when their ranks start: say so now, one
        line per strategy and count. Where no NVIDIA tool tells the count, nothing is said."""
        if self.jobs_at_once or environ.get("SLURM_JOB_ID"):
            return
        wanted = {name: run.strategy_class.gpus_per_node(run.config)
                  for name, run in self.runs.items() if run.strategy_class.launched}
        if not any(n > 1 for n in wanted.values()):
            return
        count = count_gpus()
        if count is None:
            return
        alike: dict[str, list[str]] = {}  # one line per message: a sweep has many alike
        for name, gpus in wanted.items():
            if gpus > count:
                alike.setdefault(too_few_gpus(self.runs[name].strategy, gpus, count),
                                 []).append(name)
        for line, names in alike.items():
            more = f" (and {len(names) - 1} more alike)" if len(names) > 1 else ""
            self.log.warning(f"WARNING: run {names[0]}{more}: {line} (nvidia-smi -L; a local "
                             "run stops there, before NCCL starts; under profiles/slurm each "
                             "rank gets a GPU of its own)")

    def describe_sharing(self) -> str:
        """The pack line's part on MPS-shared packs (pack.per_gpu), empty without them."""
        shared = [p for p in self.packs.values() if p.kind == "mps"]
        if not shared:
            return ""
        per_gpu, largest = shared[0].per_gpu, max(len(p.members) for p in shared)
        return (f"; {len(shared)} GPU pack(s) share each GPU between {per_gpu} members through "
                f"one private MPS daemon per node (a pack of {largest} asks gres=gpu:"
                f"{mps_gpus(largest, per_gpu)}; one Slurm step holds the node's GPUs and "
                "starts the members)")

    def check_against_cluster(self, limits_of=read_limits, partitions_of=read_partitions) -> None:
        """`snakemake -n` says what the plan submits and, where Slurm tells, whether it fits;
        refusals stop a run with --jobs (profiles/slurm), else they are warnings."""
        units = [p.members for p in self.packs.values()]
        units += [[name] for name in self.runs if name not in self.chain.pack_of]
        runtimes: dict = {}
        for name, run in self.runs.items():
            runtimes.setdefault(run.resources["runtime"], []).append(name)
        segments = [len(self.runs[members[0]].segment_epochs) for members in units]
        partition = self.slurm_placement.get("slurm_partition", "")
        limits = limits_of(partition)
        lines, errors = check_plan(
            len(self.runs), len(units), max(segments), sum(segments), runtimes,
            limits, self.jobs_at_once)
        shapes = job_shapes(self.runs, self.packs)
        slices = gpu_slice_errors(shapes)
        if slices:  # no site gives a job two MIG slices: refused whoever submits
            raise self.error(slices[0])
        if limits is not None:  # Slurm answered; else asking again only waits for it to fail
            partitions = partitions_of()
            errors += check_fit(shapes, partition, partitions)
            for warning in gpu_share_warnings(shapes, partition, partitions):
                self.log.warning(f"WARNING: {warning}")
        for line in lines:
            self.log.info(line)
        if errors and self.jobs_at_once:
            raise self.error("\n".join(errors))
        for error in errors:
            self.log.warning(f"WARNING: {error} (a run through profiles/slurm stops here)")

    # ---- the jobs' software ---------------------------------------------------------------
    def job_command(self) -> str:
        """The engine in jobs, after the prologue. The venv of env.mode venv must have this
        project installed; the one env.mode slurm_tmpdir builds holds env.requirements alone,
        so the package comes from PYTHONPATH there."""
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

    def prepare_job_venvs(self, installed=installed_closure, check=check_wheelhouse) -> None:
        """env.mode slurm_tmpdir, in the main process: write the job requirements (the login
        node's own versions of the training stack, unless the user names a file) and, with
        env.check_wheelhouse, refuse the plan here if the wheelhouse cannot give them: one
        pip dry run per new requirements digest, before any job is queued."""
        if self.env["mode"] != "slurm_tmpdir":
            return
        if not self.env["requirements"]:
            closure = installed(TRAINING_STACK)
            absent = [name for name in TRAINING_STACK if name not in closure]
            if absent:
                raise self.error(f"env.mode slurm_tmpdir: the job venvs install the training "
                                 f"stack at this venv's versions, but {', '.join(absent)} "
                                 "is not installed here: pip install -r requirements.txt")
            if write_if_changed(self.job_requirements, job_requirements(closure)):
                self.log.info(f"job venvs install {len(closure)} distributions at this venv's "
                              f"versions: {self.job_requirements}")
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
        return gpu_request(self.config["resources"]["gpu_model"], 1)

    def fetch_args(self) -> str:
        return fetch_args(self.config["data"])

    # ---- a run's segments (one job per run and segment) ----------------------------------
    def runs_of(self, strategy: str) -> list[str]:
        return [name for name, run in self.runs.items() if run.strategy == strategy]

    def per_run(self, strategy: str, value_of: Callable[[Run], object]):
        """An attribute of a training rule, as one constant where all runs of the strategy
        share it (Snakemake evaluates a function for every job, which a sweep of thousands of
        jobs feels), else a function of the run wildcard."""
        values = {name: value_of(self.runs[name]) for name in self.runs_of(strategy)}
        if len(set(map(repr, values.values()))) == 1:
            return next(iter(values.values()))
        return lambda wildcards: values[wildcards.run]

    def threads(self, strategy: str):
        return self.per_run(strategy, lambda run: run.threads)

    def launch_prefix(self, strategy: str):
        """What the training command starts under: the strategy's launcher and wrappers."""
        return self.per_run(strategy,
                            lambda run: run.strategy_class.command_prefix(self.python, run))

    def previous_segment(self, wildcards):
        k = int(wildcards.segment)
        return RunPaths(self.results, wildcards.run).segment(k - 1) if k > 1 else []

    def segment_args(self, wildcards) -> str:
        """`cifarflow train`'s arguments for the segment job (RunPaths.train_args)."""
        run, k = self.runs[wildcards.run], int(wildcards.segment)
        return shlex.join(RunPaths(self.results, run.name).train_args(
            k, data=self.batches, until_epoch=run.until_epoch(k),
            stage=self.config["data"]["stage"]))

    def sized_request(self, runs: list[str], k: int, previous: list, attempt: int, name: str,
                      policy=None):
        """The request of segment k of `runs` (one, or a pack's members, who share one):
        the configured one (``policy``, else the first run's), or from the previous
        segment's measurement (resources.autosize), with more memory after tries of this
        segment that ran out of it (retries only)."""
        first = self.runs[runs[0]]
        ooms = 0
        if attempt > 1:
            ooms = max(out_of_memory_count(RunPaths(self.results, run).root, k,
                                           logs_dir=RunPaths(self.results, run).logs)
                       for run in runs)
        request = (policy or first.policy).request(previous, first.until_epoch(k), ooms)
        if request.why and (name, k, attempt) not in self.sizing_logged:
            self.sizing_logged.add((name, k, attempt))
            self.log.info(f"{name} segment {k}: {request.why}")
        return request

    def segment_request(self, key: str):
        """mem_mb or runtime of a segment job, sized (sized_request) once its input exists."""

        def value(wildcards, input, attempt):
            k = int(wildcards.segment)
            previous = [input.previous] if k > 1 and Path(input.previous).is_dir() else []
            return getattr(self.sized_request([wildcards.run], k, previous, attempt,
                                              wildcards.run), key)

        return value

    def run_resources(self, strategy: str) -> dict:
        """Rule resources, per run, plus `mpi`: its presence tells the Slurm jobstep not to
        wrap the command in an srun step of its own, since our launcher starts the step.
        Empty for one task (the plugin submits it as such; it refuses an mpi job of one task).
        Memory and runtime are sized per segment (segment_request)."""
        keys = sorted({key for name in self.runs_of(strategy) for key in self.runs[name].resources})
        res = {key: self.per_run(strategy, lambda run, key=key: run.resources[key])
               for key in keys}
        res.update(mem_mb=self.segment_request("mem_mb"), runtime=self.segment_request("runtime"))
        res.update(self.slurm_placement)
        res["mpi"] = self.per_run(strategy,
                                  lambda run: "srun" if run.config.world_size > 1 else "")
        return res

    # ---- a pack's segments (one job per pack and segment) --------------------------------
    def pack_kind(self, strategy: str):
        """How a strategy's packs train (PACK_KINDS); a strategy's packs share one kind."""
        kinds = {pack.kind for pack in self.packs.values() if pack.strategy == strategy}
        if len(kinds) != 1:
            raise self.error(f"packs of {strategy}: one kind each, not {sorted(kinds)}")
        return PACK_KINDS[kinds.pop()]

    def pack_members(self, wildcards) -> list[str]:
        """The runs a pack's segment job trains (all, but after pruning and in extra segments)."""
        return self.chain.members(wildcards.pack, int(wildcards.segment))

    def previous_pack_segment(self, wildcards):
        k = int(wildcards.segment)
        return pack_marker(self.results, wildcards.pack, k - 1) if k > 1 else []

    def pack_specs(self, wildcards) -> list[str]:
        return [RunPaths(self.results, run).spec for run in self.packs[wildcards.pack].members]

    def pack_request(self, wildcards, attempt: int):
        """A member task's request, sized from all members' previous segments (sized_request);
        a fused pack's one process as a whole (its members record that process's peak)."""
        k, members = int(wildcards.segment), self.pack_members(wildcards)
        previous = [RunPaths(self.results, run).segment(k - 1) for run in members] if k > 1 else []
        pack, policy = self.packs[wildcards.pack], None
        if pack.fuse:
            first = self.runs[members[0]].policy
            whole = StepPack.task_mem_mb(pack, len(members), first.mem_mb)
            policy = dataclasses.replace(first, mem_mb=whole,
                                         max_mem_mb=max(first.max_mem_mb, whole))
        return self.sized_request(members, k, previous, attempt, wildcards.pack, policy)

    def pack_resources(self, strategy: str) -> dict:
        return {**self.pack_kind(strategy).resources(self, strategy), **self.slurm_placement}

    def pack_threads(self, strategy: str):
        kind = self.pack_kind(strategy)
        return lambda wildcards: kind.threads(self, wildcards)

    def pack_args(self, strategy: str):
        kind = self.pack_kind(strategy)
        return lambda wildcards: kind.args(self, wildcards)

    def pack_command(self, strategy: str) -> str:
        """The pack job's command line (a shell template), built by its kind."""
        return self.pack_kind(strategy).command

    # ---- the chains, and what aggregation reads -------------------------------------------
    def segment_output(self, run: str, k: int) -> str:
        """Segment k of a run, once its job (its own, or its pack's) ran: until then the
        checkpoint's "not run yet" exception, which schedules that job."""
        train_rule = getattr(self.checkpoints, f"train_{self.runs[run].strategy}")
        if run in self.chain.pack_of:
            train_rule.get(pack=self.chain.pack_of[run], segment=k)
            return RunPaths(self.results, run).segment(k)
        return train_rule.get(run=run, segment=k).output.ckpt

    def final_segment(self, run: str) -> str:
        try:
            return self.chain.final_segment(run)
        except ValueError as exc:
            raise self.error(str(exc))

    def final_metrics(self) -> dict:
        """One input function per run: each waits on its own chain, so Snakemake schedules
        all runs at once (an unpack()ed function would wake them one at a time)."""
        return {run: (lambda wildcards, run=run: f"{self.final_segment(run)}/metrics.jsonl")
                for run in self.runs}

    def existing_metrics(self) -> dict[str, str]:
        """The most advanced finished segment of each run that has one."""
        found = {}
        for name in self.runs:
            segments = sorted(Path(RunPaths(self.results, name).root).glob(
                "segment-*/metrics.jsonl"), key=segment_number)
            if segments:
                found[name] = str(segments[-1])
        return found

    def runs_file(self, metrics) -> dict:
        """What aggregation needs to know about each run, metrics path included: `metrics`
        maps run names to their last metrics.jsonl (rule input or what exists)."""
        metrics = {name: str(metrics[name]) for name in self.runs if name in metrics.keys()}
        data = self.data_record()
        return {
            name: {
                "strategy": run.strategy,
                "swept": run.swept,
                "spec": run.spec,
                "resources": run.resources,
                "segments": segment_number(metrics.get(name, "")),
                "metrics": metrics.get(name),
                "pruned_at": self.chain.known_pruned_at(name),
                "planned_segments": len(run.segment_epochs),
                "logs": RunPaths(self.results, name).logs,
                "data": data if data and data.get("data_id") == run.config.data_id else None,
            }
            for name, run in self.runs.items()
        }

    def write_runs_file(self, metrics, path) -> None:
        """The runs file (runs_file), a file, not an argument: Linux caps one argument at
        128 KiB (~150 runs)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.runs_file(metrics), indent=1) + "\n")
