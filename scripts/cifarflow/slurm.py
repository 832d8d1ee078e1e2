"""Every question this project asks Slurm (squeue, scontrol, sacct, sacctmgr), and the one
thing it tells it (scancel): each command line once, one timeout, one error policy.

A command runs at most ``TIMEOUT_S`` seconds, in a session of its own, so a timeout kills
everything it started. Its ``Reply`` says how it went: ``ok`` (its output, which counts
only then), ``missing`` (no such command: no Slurm client here), ``timeout``, or ``failed``
(its exit status and stderr). Nothing here raises or waits longer; each query says what
an unanswered question is to it (None: unknown). No torch.
"""

from __future__ import annotations

import functools
import getpass
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from datetime import datetime

TIMEOUT_S = 20.0  # a busy slurmctld answers within seconds; a hung one must not hang a job


@dataclass(frozen=True)
class Reply:
    argv: tuple
    status: str       # ok | missing | timeout | failed
    stdout: str = ""  # what it printed; empty unless ok
    detail: str = ""  # why not, in one line: for a log
    stderr: str = ""  # what it printed there, whole (sbatch --test-only answers there)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def ask(argv: list[str], timeout_s: float | None = None) -> Reply:
    """Run one Slurm client command; never raises, never outlives ``timeout_s``."""
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    except OSError as exc:  # not installed, not executable
        return Reply(tuple(argv), "missing", detail=f"{argv[0]}: {exc.strerror or exc}")
    with proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its session: what it started goes too
            proc.wait()
            return Reply(tuple(argv), "timeout",
                         detail=f"{argv[0]}: no answer within {timeout_s:g} s")
    if proc.returncode != 0:
        return Reply(tuple(argv), "failed", "", f"{argv[0]}: exit status {proc.returncode}: "
                     + (err.strip().splitlines() or [""])[-1], err)
    return Reply(tuple(argv), "ok", out, stderr=err)


def fields(text: str) -> dict:
    """key=value pairs of scontrol's one-record output (or `key = value` lines)."""
    found = dict(re.findall(r"(\w+)=(\S*)", text))
    found.update(re.findall(r"^(\w+)\s+=\s+(.*?)\s*$", text, flags=re.M))
    return found


def minutes(text: str) -> float | None:
    """Slurm's time format in minutes: a partition's MaxTime (minutes, minutes:seconds,
    hours:minutes:seconds, days-hours[:minutes[:seconds]]) and sacct's durations (Elapsed,
    TotalCPU [DD-][HH:]MM:SS[.fff]); None for UNLIMITED, INFINITE, INVALID,
    Partition_Limit or an empty field."""
    days, _, rest = text.strip().rpartition("-")
    try:
        parts = [float(p) for p in rest.split(":")]
        days = float(days) if days else None
    except ValueError:  # UNLIMITED, INFINITE, NONE, INVALID, Partition_Limit, ""
        return None
    if days is not None:  # days-hours[:minutes[:seconds]]
        h, m, s = (parts + [0, 0])[:3]
        return days * 1440 + h * 60 + m + s / 60
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:  # minutes:seconds
        return parts[0] + parts[1] / 60
    return parts[0] * 60 + parts[1] + parts[2] / 60


def timestamp(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:  # N/A, Unknown, empty
        return None


# ---- one job --------------------------------------------------------------------------
def job_record(job: str) -> dict:
    """The job's fields as ``scontrol show job`` gives them ({} where unknown): two RPCs
    (the job and the federation), where squeue reads the partitions too (issue 47)."""
    reply = ask(["scontrol", "show", "job", job])
    return fields(reply.stdout.split("\n\n")[0]) if reply.ok else {}


def job_times(job: str) -> tuple[float | None, float | None]:
    """(when the job's time limit ends (unix time), seconds it waited in the queue between
    its submission and its start), in one scontrol call; None where unknown."""
    record = job_record(job)
    end, submit, start = (timestamp(record.get(k, "")) for k in ("EndTime", "SubmitTime",
                                                                   "StartTime"))
    return end, start - submit if None not in (submit, start) else None


def job_end_time(job: str) -> float | None:
    """When the job's time limit ends (unix time); None where unknown."""
    return job_times(job)[0]


def job_queue_wait_s(job: str) -> float | None:
    """Seconds between the job's submission and its start; None where unknown."""
    return job_times(job)[1]


def job_alive(job: str) -> bool | None:
    """Pending, running, suspended or completing (squeue lists no ended job by default);
    False where squeue refuses the id (the controller forgot it); None: no answer."""
    reply = ask(["squeue", "-h", "-j", job, "-o", "%T"])
    if reply.status in ("missing", "timeout"):
        return None
    return reply.ok and bool(reply.stdout.strip())


def queue_states(jobs: list[str]) -> dict[str, str] | None:
    """squeue's state of each of these jobs slurmctld still lists (ended ones too, while it
    remembers them: MinJobAge), without accounting. None where squeue does not answer (a
    slurmctld restart); {} where it knows none of them (it then refuses the ids)."""
    ids = sorted(set(filter(None, jobs)))
    if not ids:
        return {}
    reply = ask(["squeue", "--states=all", "-h", "-j", ",".join(ids), "-o", "%A|%T"])
    if not reply.ok:
        return {} if "Invalid job id" in reply.stderr else None
    found = {}
    for line in reply.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job in ids and state.split():
            found[job] = state.split()[0].rstrip("+")
    return found


def job_state(job: str) -> str | None:
    """The job's state (CANCELLED, OUT_OF_MEMORY, ...); None where unknown."""
    return job_states([job]).get(job)


def job_states(jobs: list[str]) -> dict[str, str]:
    """The state of each of these jobs, in one question: sacct where there is accounting,
    else (and for the jobs it does not name) squeue while the controller remembers them
    (MinJobAge). A job neither names is left out. Keyed by the unique id (an array task's
    own, as SLURM_JOB_ID gives it)."""
    found: dict[str, str] = {}
    wanted = sorted(set(filter(None, jobs)))
    if not wanted:
        return found
    for line in ask(["sacct", "-X", "-P", "-n", "-j", ",".join(wanted), "-o",
                     "JobIDRaw,State"]).stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job in wanted and state.split():
            found[job] = state.split()[0].rstrip("+")  # "CANCELLED by 0" -> CANCELLED
    left = [job for job in wanted if job not in found]  # squeue: what sacct lacks
    return {**found, **(queue_states(left) or {})} if left else found


# what a finished job used and asked, per job and step (results/accounting.py parses it)
ACCOUNTING_FIELDS = "JobIDRaw,JobName,Elapsed,TotalCPU,AllocCPUS,MaxRSS,ReqMem,Timelimit,State,NTasks"


def job_accounting(jobs: list[str]) -> str | None:
    """sacct's lines (ACCOUNTING_FIELDS, |-separated) of these jobs and their steps, in one
    call; None where sacct does not answer (no accounting, no Slurm) or there is no job."""
    ids = sorted(set(filter(None, jobs)))
    if not ids:
        return None
    reply = ask(["sacct", "-P", "-n", "-j", ",".join(ids), "-o", ACCOUNTING_FIELDS])
    return reply.stdout if reply.ok else None


def job_tasks(job: str) -> int | None:
    """NumTasks of the job (the Snakemake jobstep strips SLURM_NTASKS from its command)."""
    tasks = job_record(job).get("NumTasks", "")
    return int(tasks) if tasks.isdigit() else None


def cancel(*jobs: str) -> Reply:
    """scancel these jobs, in one call."""
    return ask(["scancel", *jobs])


# ---- the cluster ----------------------------------------------------------------------
def first_hostname(nodelist: str) -> str | None:
    """First host of a Slurm hostlist (``cn[0012-0014],gpu7``), as Slurm expands it."""
    names = ask(["scontrol", "show", "hostnames", nodelist]).stdout.split()
    return names[0] if names else None


# What the plan reads of the cluster is read once per process: a controller re-plans after
# each checkpoint, and the cluster's shape does not change under it (forget() for tests).
@functools.cache
def cluster_config() -> dict | None:
    """``scontrol show config`` as key/value pairs; None where Slurm does not answer."""
    reply = ask(["scontrol", "show", "config"])
    return fields(reply.stdout) if reply.ok else None


def partition(name: str = "") -> dict:
    """The partition's record (the default partition's for ""); {} where unknown."""
    reply = ask(["scontrol", "show", "partition", "-o"] + ([name] if name else []))
    records = [fields(line) for line in reply.stdout.splitlines() if line.strip()]
    default = [r for r in records if not name and r.get("Default") == "YES"]
    return (default or records or [{}])[0]


@functools.cache
def records(kind: str) -> list[dict]:
    """Every record of ``scontrol show <kind>`` (partition, node), hidden ones too; [] where
    Slurm does not answer."""
    reply = ask(["scontrol", "-a", "-o", "show", kind])
    return [fields(line) for line in reply.stdout.splitlines() if line.strip()]


def will_run(flags: list[str]) -> Reply:
    """``sbatch --test-only``: where and when Slurm would start a batch job of these options
    (the site's submit plugin, associations, QOS and partition access all run), or why it
    refuses it; nothing is submitted. Its answer is on stderr either way."""
    return ask(["sbatch", "--test-only", *flags, "--wrap", "true"])


def my_jobs(format: str) -> str | None:
    """This user's queued jobs (every state squeue lists, each array task one line, as the
    submit limit counts them), one line each in squeue's ``format``; None where Slurm does
    not answer."""
    reply = ask(["squeue", "--me", "-h", "-r", "-o", format])
    return reply.stdout if reply.ok else None


def reservations() -> list[dict]:
    """Every reservation (``scontrol show reservation``: Nodes, Flags, StartTime, EndTime,
    ...); [] where there is none or Slurm does not answer."""
    reply = ask(["scontrol", "-o", "show", "reservation"])
    return [r for r in map(fields, reply.stdout.splitlines()) if r.get("ReservationName")]


@functools.cache
def submit_limits(user: str) -> list[int]:
    """MaxSubmitJobs of the user's associations and MaxSubmitPU of the QOSes those
    associations may use (sacctmgr, with accounting): every limit that is set. A QOS the
    user is not in limits someone else."""
    assoc = ask(["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}",
                 "format=MaxSubmit,QOS"]).stdout
    limits, mine = [], set()
    for line in assoc.splitlines():
        most, _, qos = line.partition("|")
        limits += [int(most)] if most.strip().isdigit() else []
        mine.update(q.strip() for q in qos.split(",") if q.strip())
    for line in ask(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxSubmitPU"]).stdout.splitlines():
        name, _, most = line.partition("|")
        if name.strip() in mine and most.strip().isdigit():
            limits.append(int(most))
    return limits


@functools.cache
def user_accounts(user: str) -> tuple[str, ...] | None:
    """The accounts the user may submit to (sacctmgr's associations, in its order, once
    each); None where sacctmgr does not answer (no accounting)."""
    reply = ask(["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}",
                 "format=Account"])
    if not reply.ok:
        return None
    return tuple(dict.fromkeys(a.strip() for a in reply.stdout.splitlines() if a.strip()))


def user() -> str:
    """Whose associations to ask for: $USER, else the login name of this process."""
    return os.environ.get("USER") or getpass.getuser()


def forget() -> None:
    """Ask the cluster again (the cached reads above): for tests that change it."""
    for read in (cluster_config, records, submit_limits, user_accounts):
        read.cache_clear()
