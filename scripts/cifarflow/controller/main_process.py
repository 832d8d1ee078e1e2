"""What only the process that plans does, once (not every job again): the checks at
`snakemake -n` (the data folders, job venvs, the cluster, local GPUs), the run specs, what
the plan says it submits, and the watches while it trains. A part of the WorkflowPlan. No
torch."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Callable

from . import quota, storage
from .cluster_checks import check_cluster, check_storage
from ..data import ARCHIVE_NAME, fetch_record
from ..data_folders import describe_data
from ..engine.gpu_monitor import visible_gpus
from ..engine.strategies.ddp import too_few_gpus
from ..job.mps_daemon import mps_gpus
from ..job.tries import INVOCATION
from ..layout import RunPaths
from .packs import describe_pack_nodes
from .pending import PendingWatch
from .pack_plan import describe_fusion
from .plan import check_user_models
from .progress import watch_progress

# what a run's spec may change while its finished segments stand (segments.elastic)
ELASTIC_FIELDS = {"world_size", "nodes"}
# what a spec may gain or change while its finished segments stand, since no weight it
# trains changes: what a run reports (tensorboard), where it may resume from (the interval
# of checkpoint_interval_s: auto, which follows the sweep's size) and which finished weights
# it keeps on disk (keep_weights: auto becomes last when a sweep grows past a few runs)
UNTRAINED_FIELDS = {"tensorboard", "checkpoint_interval_s", "keep_weights"}


class MainProcess:
    """The WorkflowPlan's duties in the main Snakemake process."""

    def start_main_process(self, workdir: str = ".", on_slurm: Callable[[], bool] = lambda: False,
                           training: Callable[[], bool] = lambda: False,
                           environ=os.environ) -> None:
        """What only the process that plans does (not every job again): mark this run of the
        workflow (which tries of a segment are its own), fix Snakemake, check the user's
        models (imports torch), write the run specs, say what the plan submits, watch for
        jobs pending forever while ``on_slurm()`` (it submits to Slurm, for real) and say
        how far the plan got while ``training()`` (not a dry run)."""
        environ[INVOCATION] = f"{time.time():.0f}.{os.getpid()}"
        self.main_process = True  # a later search round's specs are written here too
        from .snakemake_fixes import keep_restarted_jobs_ready

        keep_restarted_jobs_ready()  # retried segments are not lost when a checkpoint finishes
        try:
            self.user_model_sizes = check_user_models(self.runs.values())
        except ValueError as exc:
            raise self.error(f"config error: {exc}")
        self.check_results_dir()
        self.describe_data()
        self.write_specs()
        self.announce()
        self.check_strategy_packages()
        self.prepare_job_venvs()
        self.check_against_cluster()
        self.check_local_gpus(environ=environ)
        self.pending_watch = PendingWatch(workdir, self.log.warning,
                                          self.config["slurm"]["pending_check_s"],
                                          active=on_slurm).start()
        self.progress_watch = watch_progress(self.results, self.chain, self.log.info,
                                             self.config["progress_s"], training)

    def check_results_dir(self) -> None:
        """results: is where every run writes: one line, naming the key, if it cannot be."""
        where = Path(self.results)
        try:
            where.mkdir(parents=True, exist_ok=True)
            writable = os.access(where, os.W_OK | os.X_OK)
        except OSError as exc:
            writable, why = False, exc.strerror
        else:
            why = "not writable"
        if not writable:
            raise self.error(f"results: {self.results} cannot be written here ({why}): set "
                             "results: in config/config.yaml (or --config results=DIR) to a "
                             "folder you can write, e.g. /scratch/$USER/<sweep> on a cluster")

    def data_record(self) -> dict | None:
        """What fetch-data wrote of the plan's data (its folder, data_folders.py): source,
        data id, md5."""
        return fetch_record(Path(self.data_dir, ARCHIVE_NAME))

    def describe_data(self) -> None:
        """Which data folders results/data holds, and which one the plan trains on: each
        data id has its own, so no data.source replaces another's data."""
        self.log.info(describe_data(self.results, self.data_id, self.config["data"]["source"]))

    def write_specs(self, runs=None) -> None:
        """The run's typed config, handed to every segment as one file (spec.json), written
        where Snakemake plans, and only when it changed: its time stamp says when the run's
        config last changed (a job per run would cost one Snakemake start each), so the
        finished segments are trained again. But a new world size under segments.elastic
        keeps the time stamp: the finished segments stand and the next resumes from them;
        so does a change of what trains no weight (UNTRAINED_FIELDS)."""
        for run in self.runs.values() if runs is None else runs:
            if not run.sampled:
                continue  # a later search round's trial: written once its round is asked
            spec = Path(RunPaths(self.results, run.name).spec)
            old = spec.read_text() if spec.is_file() else None
            if old == run.config.to_json():
                continue  # its time stamp keeps saying when the config last changed
            stamp = spec.stat() if old else None
            run.config.write(spec)
            before, now = json.loads(old) if old else {}, run.config.to_dict()
            changed = {key for key in now if before.get(key) != now[key]}
            if before and changed <= UNTRAINED_FIELDS:
                os.utime(spec, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
                continue
            if not before or before.get("world_size") == now["world_size"]:
                continue
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
                   "and segment" if self.unpacked else "") + describe_pack_nodes(self.packs)
                + self.describe_sharing())
        if self.config["pack"]["fuse"] and self.packs:
            self.log.info(describe_fusion(self.runs, self.packs))
        self.describe_search()
        self.log.info(storage.describe(self.storage, self.keep_weights))
        if self.config["train"]["checkpoint_interval_s"] == "auto":
            self.log.info(storage.describe_intervals(self.runs.values()))

    @functools.cached_property
    def storage(self) -> storage.Estimate:
        """What the plan will hold under results/ (storage.py)."""
        return storage.estimate(self.runs.values(), self.packs.values(),
                                self.config["data"]["source"] != "synthetic",
                                self.user_model_sizes)

    @property
    def keep_weights(self) -> str:
        return self.config["segments"]["keep_weights"]  # settled: all or last (plan.py)

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

    def check_against_cluster(self, room_of=quota.room, **readers) -> None:
        """`snakemake -n` says what the plan submits and, where Slurm tells, whether it fits
        (cluster_checks.py; ``readers``: its limits_of, partitions_of, accounts_of) and
        whether results: has room for it; refusals stop a run with --jobs
        (profiles/slurm), else they are warnings. Each job's account is settled here."""
        units = [p.members for p in self.packs.values()]
        units += [[name] for name in self.runs if name not in self.chain.pack_of]
        found = check_cluster(self.runs, self.packs, units, self.slurm_placement,
                              bool(self.env_gpu), self.jobs_at_once, **readers)
        if found.fatal:  # refused whoever submits
            raise self.error(found.fatal[0])
        self.job_accounts = found.accounts
        stored = check_storage(self.storage, self.keep_weights, self.results, room_of)
        for line in found.lines:
            self.log.info(line)
        for warning in found.warnings + stored.warnings:
            self.log.warning(f"WARNING: {warning}")
        errors = found.errors + stored.errors
        if errors and self.jobs_at_once:
            raise self.error("\n".join(errors))
        for error in errors:
            self.log.warning(f"WARNING: {error} (a run through profiles/slurm stops here)")
