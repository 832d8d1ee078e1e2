"""Touch only the jobs this controller submitted. The main Snakemake process records, in the
results folder (slurm_queue.JobRecord):

- that it took the working directory's lock (its invocation, host, pid, Slurm job where it
  runs as one, the lock files), once Snakemake holds the lock;
- each Slurm job it submits, as the executor plugin reports it;
- that it ended.

When it ends (all done, failed, or Ctrl-C) it cancels those of ITS jobs Slurm still lists,
each named in one line: Snakemake cancels the jobs it still waits for; what it no longer
knows of would stay (a copy of a segment's job that Slurm requeued after its batch script
ended, which would start later, hold an allocation and find its work done). A controller
that never held the lock (refused by it, a dry run, --nolock) submitted nothing and cancels
nothing: a second command typed in the folder of a running sweep leaves that sweep alone.

A controller that died (SIGKILL, a lost node, its controller job cancelled) leaves its lock
and its jobs. The next one finds the lock stale (that controller's process, or its Slurm
job, is gone) and replaces it, saying so; the jobs it left are taken over by the new run's
tries (job/takeover.py), never cancelled here. No torch."""

from __future__ import annotations

import os
import socket
import sys
from typing import Callable

from .. import slurm
from ..job.takeover import process_argv
from ..jobfacts import job_id
from ..slurm_queue import JobRecord, still_queued


def say_at_exit(line: str) -> None:
    """A line when the process ends, where Snakemake's logger may be closed already."""
    print(f"[cifarflow] {line}", file=sys.stderr, flush=True)


def process_is_snakemake(pid: int) -> bool:
    return any(b"snakemake" in a for a in process_argv(pid))


def controller_alive(entry: dict, host: str | None = None,
                     job_alive: Callable[[str], bool | None] = slurm.job_alive) -> bool | None:
    """Whether the controller of a "controller" entry still runs: its Slurm job listed, or
    its process on this host still a Snakemake; None where nothing here can tell (another
    host, no answer from Slurm)."""
    if entry.get("slurm_job"):
        return job_alive(entry["slurm_job"])
    if entry.get("host") == (host or socket.gethostname()) and entry.get("pid"):
        return process_is_snakemake(entry["pid"])
    return None


def describe_controller(entry: dict) -> str:
    where = (f"Slurm job {entry['slurm_job']}" if entry.get("slurm_job") else
             f"process {entry.get('pid')} on {entry.get('host')}")
    return f"the controller {entry['invocation']} ({where})"


class Ownership:
    """The main process's record of what it owns, and what it does about it at its end."""

    def __init__(self, results: str, invocation: str, workdir: str = ".",
                 environ=os.environ, say_at_end: Callable[[str], None] = say_at_exit,
                 cancel=slurm.cancel, queued=still_queued):
        self.record, self.invocation = JobRecord(results), invocation
        self.workdir, self.environ = os.path.realpath(workdir), environ
        self.say_at_end, self.cancel, self.queued = say_at_end, cancel, queued
        self.held = False  # the working directory's lock, taken by this process
        self.submitted: dict[str, str] = {}  # job id -> rule

    def lock_taken(self, lock_files: list[str]) -> None:
        """Snakemake holds the lock (snakemake_fixes.tell_when_locked): from now on this
        process submits, and owns what it submits."""
        self.held = True
        self.record.add("controller", self.invocation, host=socket.gethostname(),
                        pid=os.getpid(), slurm_job=job_id(self.environ) or None,
                        workdir=self.workdir, locks=[os.path.abspath(f) for f in lock_files])

    def job_submitted(self, job: str, rule: str) -> None:
        """The executor plugin submitted ``job`` (snakemake_fixes.tell_each_submission)."""
        self.submitted[job] = rule
        self.record.add("job", self.invocation, job=job, rule=rule)

    def job_cancelled(self, job: str, rule: str, who: str, runs: list[str] = ()) -> None:
        """A job of this workflow was cancelled from outside (snakemake_fixes.
        notice_outages_and_cancellations): recorded with the runs it trains (a pack's
        members, started or not), whose summary rows say cancelled."""
        self.record.add("cancelled", self.invocation, job=job, rule=rule, by=who,
                        runs=list(runs))

    def replace_stale_lock(self, say: Callable[[str], None], replace: bool = True,
                           alive=controller_alive) -> list[str]:
        """Lock files a controller of this results folder left when it died: removed (where
        ``replace``, not in a dry run), each controller named; a live one named as the
        holder. The removed files."""
        removed = []
        for entry in self.record.open_controllers():
            left = [f for f in entry.get("locks", []) if os.path.exists(f)]
            if not left or entry["invocation"] == self.invocation:
                continue
            state = alive(entry)
            who = describe_controller(entry)
            if state is None:
                say(f"the working directory is locked by {who}, which cannot be seen from "
                    "here: if it is gone, `snakemake --unlock` (its jobs are taken over, not "
                    "cancelled)")
            elif state:
                say(f"the working directory is locked by {who}, which still runs: wait for it, "
                    "or stop it first")
            elif replace:
                for f in left:
                    os.remove(f)
                removed += left
                self.record.add("end", entry["invocation"], replaced_by=self.invocation)
                say(f"{who} is gone and left its lock: replaced; its jobs still queued are "
                    "taken over by this run's tries, not cancelled")
            else:
                say(f"{who} is gone and left its lock: a run (not -n) replaces it")
        return removed

    def at_exit(self) -> list[str]:
        """The end of the process: if it held the lock, record its end and cancel its own
        jobs Slurm still lists (one scancel, one line); their ids."""
        if not self.held:
            return []  # refused by the lock, a dry run: it owns nothing
        self.record.add("end", self.invocation)
        left = self.queued(self.submitted) if self.submitted else []
        if left is None:
            self.say_at_end(f"WARNING: squeue did not answer: whether any of the "
                            f"{len(self.submitted)} job(s) this workflow submitted is still "
                            f"queued is unknown (their ids: {self.record.path})")
            return []
        if not left:
            return []
        jobs = [j["job"] for j in left]
        reply = self.cancel(*jobs)
        named = ", ".join(f"{j['job']} ({self.submitted[j['job']]}, {j['state']})" for j in left)
        if reply.ok:
            self.say_at_end(f"the workflow ended with {len(jobs)} job(s) of its own still in "
                            f"Slurm's queue, which nothing waits for: cancelled {named}")
        else:
            self.say_at_end(f"WARNING: the workflow ended with {len(jobs)} job(s) of its own "
                            f"still in Slurm's queue ({named}), and scancel failed "
                            f"({reply.detail}): scancel {' '.join(jobs)}")
        return jobs
