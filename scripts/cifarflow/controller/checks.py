"""The checks of the plan at `snakemake -n`, in the main process only: results: writable,
the data kept there, the user's models, the local GPUs, and the plan against the cluster
(cluster_checks.py) and the room under results:, which settles each job's account. The
WorkflowPlan's ``checks``. No torch (but where a user's model is measured)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ..config import data_identity
from ..data_folders import describe_data
from ..engine.gpu_monitor import visible_gpus
from ..engine.strategies.ddp import too_few_gpus
from . import quota, storage
from .cluster_checks import ask_slurm_too, check_cluster, check_storage
from .pack_plan import Pack
from .placement import Placement
from .plan import Run, check_user_models
from .sites import current as current_site, read_only_folder


class PlanChecks:
    """What the plan is checked against before anything is submitted. Refusals raise
    ``error`` (one line naming the way out); warnings go to ``log``."""

    def __init__(self, config: dict, runs: dict[str, Run], packs: dict[str, Pack],
                 placement: Placement, env_gpu: bool, jobs_at_once: int | None, log,
                 error: type[Exception]):
        self.config, self.runs, self.packs, self.placement = config, runs, packs, placement
        self.env_gpu, self.jobs_at_once, self.log, self.error = env_gpu, jobs_at_once, log, error
        self.results, self.data_id = config["results"], data_identity(config["data"])
        self.user_model_sizes: dict = {}  # measured at -n (user_models)

    def user_models(self) -> None:
        """A user's module:factory model is built once here (imports torch): its size counts
        in the storage estimate."""
        try:
            self.user_model_sizes = check_user_models(self.runs.values())
        except ValueError as exc:
            raise self.error(f"config error: {exc}")

    def results_dir(self) -> None:
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
        site = current_site()  # writable here, on the login node, but not on the nodes
        for what, path in ((f"results: {self.results}", where),
                           (f"the working directory {Path.cwd()} (Snakemake's .snakemake "
                            "and the jobs' Slurm logs)", Path.cwd())):
            if folder := read_only_folder(path, site):
                raise self.error(
                    f"{what} is under ${folder}, which is read-only on {site.name}'s compute "
                    f"nodes ({site.docs}): its training jobs could not write there. Work "
                    "from $SCRATCH: copy or clone the workflow there, cd to it, and set "
                    "results: to a folder under it")

    def kept_data(self, environ=os.environ) -> None:
        """Which data folders results/data holds, and which one the plan trains on: each data
        id has its own (data_folders.py), so no data.source replaces another's data. A run
        for Slurm (--jobs: profiles/slurm, or inside a job: controller-job) on the synthetic
        demo data is warned about: the first day's block once never fetched the real set."""
        source = self.config["data"]["source"]
        self.log.info(describe_data(self.results, self.data_id, source))
        if source == "synthetic" and (self.jobs_at_once or environ.get("SLURM_JOB_ID")):
            self.log.warning(
                "WARNING: data.source synthetic: every run trains on generated images "
                f"({self.data_id}), not CIFAR-10, so its accuracy says nothing of the model; "
                "for the real data set data.source: download in config/config.yaml and "
                "fetch it on the login node first: snakemake --profile profiles/slurm "
                "extract_dataset (docs/slurm.md)")

    @functools.cached_property
    def storage(self) -> storage.Estimate:
        """What the plan will hold under results/ (storage.py)."""
        return storage.estimate(self.runs.values(), self.packs.values(),
                                self.config["data"]["source"] != "synthetic",
                                self.user_model_sizes)

    def local_gpus(self, count_gpus=visible_gpus, environ=os.environ) -> None:
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

    def against_cluster(self, room_of=quota.room, jobs_of=None, ask=None, **readers) -> None:
        """`snakemake -n` says what the plan submits and, where Slurm tells, whether it fits
        (cluster_checks.py; ``readers``: its limits_of, partitions_of, accounts_of) and
        whether results: has room for it; refusals stop a run with --jobs
        (profiles/slurm), else they are warnings. Each job's account and the GPU type of
        a request that names none are settled here."""
        packed = {member for pack in self.packs.values() for member in pack.members}
        units = [p.members for p in self.packs.values()]
        units += [[name] for name in self.runs if name not in packed]
        found = check_cluster(self.runs, self.packs, units, self.placement.given,
                              self.env_gpu, self.jobs_at_once,
                              gpu_model=self.placement.gpu_model, **readers)
        if found.fatal:  # refused whoever submits
            raise self.error(found.fatal[0])
        self.placement.accounts, self.placement.gpu_type = found.accounts, found.gpu_type
        if jobs_of is not None:  # each job's first try, account and GPU type settled
            named = self.placement.given.get("slurm_partition", "")
            found = ask_slurm_too(found, jobs_of(), named, **({"ask": ask} if ask else {}))
        stored = check_storage(self.storage, self.config["segments"]["keep_weights"],
                               self.results, room_of)
        for line in found.lines:
            self.log.info(line)
        for warning in found.warnings + stored.warnings:
            self.log.warning(f"WARNING: {warning}")
        errors = found.errors + stored.errors
        if errors and self.jobs_at_once:
            raise self.error("\n".join(errors))
        for error in errors:
            self.log.warning(f"WARNING: {error} (a run through profiles/slurm stops here)")
