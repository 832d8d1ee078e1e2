"""The plan against the cluster at `snakemake -n`, in one place: the counts (limits.py),
where each job may run and whether it fits there (routing.py, gpu_limits.py), the account
of each job (accounts.py) and the room under results: (quota.py). What Slurm is asked, it
is asked once a process (slurm.py caches it). No torch here."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import slurm
from . import quota
from .accounts import job_accounts
from .gpu_limits import gpu_share_warnings, gpu_slice_errors, job_gpus
from .gpu_types import settle_gpu_type, typed_shapes
from .limits import check_plan, read_limits
from .packs import job_shapes
from .partitions import read_partitions, user_groups
from .routing import (candidates, check_fit, describe_placement, job_error,
                      unknown_partition, whole_node_notes)
from .will_run import ask_slurm


@dataclass
class Findings:
    lines: list = field(default_factory=list)     # to say
    errors: list = field(default_factory=list)    # refusals (warnings without --jobs)
    warnings: list = field(default_factory=list)  # always warnings
    fatal: list = field(default_factory=list)     # refused whoever submits
    accounts: dict | None = None                  # {on GPUs: account}, where sacctmgr told
    fit_errors: list = field(default_factory=list)  # the plan's reading of the partitions
    partitions: dict | None = None                # scontrol show partition, read
    gpu_type: str = ""                            # the nodes' GPU type (gpu_types.py)


def check_cluster(runs: dict, packs: dict, units: list, placement: dict, env_gpu: bool,
                  jobs_at_once: int | None, *, limits_of=read_limits,
                  partitions_of=read_partitions, accounts_of=slurm.user_accounts,
                  gpu_model: str = "") -> Findings:
    """What Slurm says of the plan: its counts, each job's partitions and account."""
    found = Findings()
    segments = [len(runs[members[0]].segment_epochs) for members in units]
    limits = limits_of()
    found.lines, found.errors = check_plan(len(runs), len(units), max(segments), sum(segments),
                                           limits, jobs_at_once)
    shapes = job_shapes(runs, packs)
    found.fatal = gpu_slice_errors(shapes)  # no site gives a job two MIG slices
    if limits is None:  # Slurm did not answer; asking again only waits for it to fail
        return found
    named = placement.get("slurm_partition", "")
    partitions = partitions_of()
    found.partitions = partitions
    found.lines.append(describe_placement(partitions, named))
    if env_gpu or any(job_gpus(shape) for shape in shapes.values()):
        found.gpu_type, line = settle_gpu_type(partitions, named, gpu_model)
        found.lines += [line] if line else []
        shapes = typed_shapes(shapes, found.gpu_type)
    given = placement.get("slurm_account", "")
    accounts = accounts_of(slurm.user())
    if accounts is None:
        found.lines.append(f"slurm account: sacctmgr does not answer here (no accounting): "
                           f"slurm.account {given or '(not set)'} goes to sbatch as it is")
    else:
        kinds = {job_gpus(shape) > 0 for shape in shapes.values()} | {env_gpu}
        try:
            found.accounts, line = job_accounts(given, accounts, kinds)
            found.lines.append(line)
        except ValueError as exc:
            found.errors.append(str(exc))
    found.fit_errors = check_fit(shapes, named, partitions, found.accounts, user_groups())
    found.errors += found.fit_errors
    if partitions:
        found.warnings += gpu_share_warnings(shapes, candidates(partitions, named, True)[0])
        found.warnings += whole_node_notes(shapes, named, partitions,
                                           (found.accounts or {}).get(False))
    return found


def ask_slurm_too(found: Findings, jobs: list, named: str, ask=slurm.will_run) -> Findings:
    """Slurm's own answer for each job (will_run.py) over the plan's reading of the
    partitions: where Slurm answered for every job, its refusals replace the plan's fit
    errors, and a disagreement is a warning that says so."""
    if found.partitions is None:
        return found
    jobs = [(label, res, threads, typed_shapes({label: shape}, found.gpu_type)[label])
            for label, res, threads, shape in jobs]
    model = {label: job_error(label, shape, named, found.partitions, found.accounts,
                              user_groups()) for label, _, _, shape in jobs}
    verdict = ask_slurm(jobs, found.partitions, model, ask)
    found.lines += verdict.lines
    if verdict.answered:  # the plan's fit errors give way to Slurm's, but a name it lacks
        unknown = unknown_partition(named, found.partitions)
        found.errors = [e for e in found.errors if e not in found.fit_errors or e == unknown] \
            + verdict.errors
        found.warnings += verdict.notes
    else:
        found.lines.append("sbatch --test-only did not answer for every job: the plan's "
                           "reading of the partitions decides")
        found.errors += [e for e in verdict.errors if e not in found.errors]
    return found


def check_storage(estimate, keep_weights: str, results: str, room_of=quota.room) -> Findings:
    """The plan's files and bytes against the room under results:."""
    found = Findings()
    refusal, warning = quota.check_room(estimate, keep_weights, room_of(results))
    found.errors += [refusal] if refusal else []
    found.warnings += [warning] if warning else []
    return found
