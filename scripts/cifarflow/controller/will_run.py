"""Ask Slurm instead of guessing it: at `snakemake -n` (and every run), each distinct job of
the plan is asked of Slurm with ``sbatch --test-only`` and exactly the options the executor
plugin will submit it with (the plugin's own code writes them: account, time, cores, memory,
GPUs, nodes; a partition only where the user named one). Slurm runs the site's submit plugin,
the associations, the QOS and the partitions' access lists, and answers with the partition
it would use or a refusal.

- A refusal is the plan's refusal, in Slurm's words, with the options asked.
- Slurm accepts some jobs it will never start (a runtime above the partition's MaxTime is
  taken and then pends forever where the site does not set EnforcePartLimits): the job is
  checked against the partition Slurm answered with (routing.job_error); one that can never
  start there is refused, naming the partition.
- Where the plan's own reading of the partitions (routing.check_fit) disagrees with Slurm,
  the line says so, and Slurm wins.

The cost is per distinct set of options, not per job: a sweep of 1000 alike runs asks once.
Never in a job (the main process only). No torch."""

from __future__ import annotations

import inspect
import re
import shlex
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

from .. import slurm
from .routing import job_error
from .submit_room import waits_for

# what a refusal says: the submit plugin's own words (sbatch: error: ...), else Slurm's
REFUSED = re.compile(r"^sbatch: error: (?!Batch job submission failed: )(.*)$", re.M)
FAILURE = re.compile(r"(?:allocation failure|Batch job submission failed): (.*)$", re.M)
PLACED = re.compile(r"to start at (\S+) using (\d+) processors on nodes (\S+) in partition (\S+)")
# options of the plugin's sbatch call that say nothing of where the job may run
NOT_ASKED = {"--parsable": 0, "--job-name": 1, "--output": 1, "--comment": 1, "-D": 1}


class _Resources(dict):
    """A rule's resources as the plugin reads them: .get and attributes."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def first_try(value, wildcards: dict):
    """A rule's attribute (a resource, its threads) as Snakemake gives it to the first try of
    the job of these wildcards: a function is called with the arguments it names."""
    if not callable(value):
        return value
    given = {"wildcards": SimpleNamespace(**wildcards), "attempt": 1, "threads": 1,
             "input": SimpleNamespace(previous=[])}
    return value(**{name: given[name] for name in inspect.signature(value).parameters})


def submit_flags(resources: dict, threads: int, label: str = "job") -> list[str]:
    """The sbatch options the Slurm executor plugin submits a job of these resolved rule
    resources with (its get_submit_command and set_gres_string), but its name, log, comment
    and folder."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = SimpleNamespace(resources=_Resources(resources), threads=threads, name=label)
    account, partition = resources.get("slurm_account"), resources.get("slurm_partition")
    params = {"run_uuid": "x", "slurm_logfile": "x", "comment_str": "x", "workdir": "",
              "account": f" -A {shlex.quote(str(account))}" if account else "",
              "partition": f" -p {shlex.quote(str(partition))}" if partition else ""}
    argv = shlex.split(get_submit_command(job, params) + set_gres_string(job))[1:]
    flags, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
        elif arg in NOT_ASKED:
            skip = NOT_ASKED[arg]
        else:
            flags.append(arg)
    return flags


@dataclass(frozen=True)
class Answer:
    """Slurm's answer for one set of options: the partition and nodes it would use, or
    why it refuses (``reason``); ``asked`` False where sbatch did not answer at all."""
    asked: bool
    partition: str = ""
    nodes: str = ""
    reason: str = ""


def read_answer(reply: slurm.Reply) -> Answer:
    """sbatch --test-only's answer (on stderr, either way)."""
    text = reply.stderr or ""
    placed = PLACED.search(text)
    if reply.ok and placed:
        return Answer(True, partition=placed.group(4), nodes=placed.group(3))
    if reply.status in ("missing", "timeout") or not text.strip():
        return Answer(False, reason=reply.detail)
    said = REFUSED.findall(text) or FAILURE.findall(text) or text.strip().splitlines()[-1:]
    return Answer(True, reason="; ".join(dict.fromkeys(line.strip() for line in said)))


@dataclass
class Verdict:
    lines: list = field(default_factory=list)    # where each job goes
    errors: list = field(default_factory=list)   # Slurm refuses it, or it can never start
    notes: list = field(default_factory=list)    # the plan's reading disagreed with Slurm
    answered: bool = False                       # Slurm answered for every job


def alike_label(labels: list[str]) -> str:
    return labels[0] + (f" (and {len(labels) - 1} more alike)" if len(labels) > 1 else "")


def ask_slurm(jobs: list[tuple[str, dict, int, dict]], partitions: dict | None,
              model_errors: dict[str, str | None], ask: Callable = slurm.will_run) -> Verdict:
    """``jobs``: (label, resolved rule resources, threads, shape) of each job kind of the
    plan; ``model_errors``: label -> the plan's own fit error (routing), None where it fits.
    One sbatch --test-only per distinct set of options."""
    verdict, alike = Verdict(), {}
    for label, resources, threads, shape in jobs:
        flags = submit_flags(resources, threads, label)
        alike.setdefault(tuple(flags), []).append((label, shape))
    answered = True
    for flags, members in alike.items():
        label, shape = members[0]
        who = alike_label([m[0] for m in members])
        answer = read_answer(ask(list(flags)))
        if not answer.asked:
            answered = False
            continue
        model = next((model_errors.get(m[0]) for m in members if model_errors.get(m[0])), None)
        asked = f"sbatch --test-only {shlex.join(flags)}"
        wait = waits_for(answer.reason) if answer.reason else None
        if wait == "controller":  # slurmctld does not answer now: nothing said of the job
            answered = False
            continue
        if wait == "room":  # your queue is full now, not the job refused: it waits its turn
            verdict.notes.append(f"{who}: your share of Slurm's queue is full now "
                                 f"({answer.reason}): its submissions will wait for one of "
                                 "your jobs to leave the queue (no try spent)")
            continue
        if answer.reason:
            verdict.errors.append(f"{who}: Slurm refuses it: {answer.reason} ({asked})"
                                  + (f"; {model}" if model else ""))
            continue
        verdict.lines.append(f"{who} -> partition {answer.partition} (nodes {answer.nodes})")
        there = job_error(who, shape, answer.partition, partitions) if partitions and \
            answer.partition in partitions else None
        if there:
            verdict.errors.append(f"Slurm places {who} in partition {answer.partition}, where "
                                  f"it can never start: {there}")
        elif model:
            verdict.notes.append(f"the plan's reading of the partitions refused {who} ({model}); "
                                 f"Slurm accepts it in partition {answer.partition}: going by "
                                 "Slurm")
    verdict.answered = answered and bool(alike)
    if verdict.lines:
        verdict.lines = ["where Slurm places each job (sbatch --test-only, "
                         f"{len(alike)} distinct request(s)): " + "; ".join(verdict.lines)]
    return verdict
