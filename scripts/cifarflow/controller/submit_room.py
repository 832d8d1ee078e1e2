"""Room in the user's share of the queue while the workflow runs, and a controller that
does not answer sbatch (issue 55).

Slurm's submit limit (MaxSubmitJobs of an association, MaxSubmitPU of a QOS; 1000 on most
Alliance sites) counts every job of the user: a second sweep, an interactive session, an
array submitted by hand take from it too. `snakemake -n` checks the plan against the limit
(limits.py); this is what happens when the queue is full anyway. An sbatch that Slurm
refuses for the limit is not a failed try: the submission waits until one of the user's
jobs has left the queue (one ``squeue --me`` count every ``recount_s``; the other
submissions wait behind it) and is made again, without using a retry. An sbatch that
finds no slurmctld (restarted for maintenance) is made again every ``recount_s`` alike.
Nothing is asked of Slurm while no sbatch is refused.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Callable

from .. import slurm

# what sbatch says when the user's share of the queue is full (Slurm 22.05 to 24.x)
SUBMIT_LIMIT_REASONS = ("AssocMaxSubmitJobLimit", "AssocGrpSubmitJobsLimit",
                        "QOSMaxSubmitJobPerUserLimit", "QOSGrpSubmitJobsLimit", "job submit limit")
# and when slurmctld does not answer (a restart for maintenance, minutes long)
CONTROLLER_SILENT = ("Unable to contact slurm controller", "Socket timed out on send/recv",
                     "Zero Bytes were transmitted or received")


def waits_for(message: str) -> str | None:
    """What sbatch's error ``message`` waits for: "room" (a submit limit), "controller"
    (slurmctld does not answer), or None (a refusal to report: the job fails)."""
    if any(reason in message for reason in SUBMIT_LIMIT_REASONS):
        return "room"
    if any(reason in message for reason in CONTROLLER_SILENT):
        return "controller"
    return None


def sbatch_words(message: str) -> str:
    """sbatch's own last error line out of the plugin's report of it."""
    said = re.findall(r"sbatch: error: [^\n']*", message)
    return (said[-1] if said else message.strip().splitlines()[-1])[:200]


def count_my_jobs() -> int | None:
    """The user's jobs in the queue now, each array task one (as the limit counts them);
    None where squeue does not answer."""
    listed = slurm.my_jobs("%i")
    return None if listed is None else len(listed.split())


class SubmitRoom:
    """Shared by the submission threads of one controller. ``limit_of()``: the submit limit
    Slurm's accounting sets (None: unknown), asked only once a submission is refused."""

    def __init__(self, say: Callable[[str], None], limit_of: Callable[[], int | None],
                 count: Callable[[], int | None] = count_my_jobs, recount_s: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep):
        self.say, self.limit_of, self.count = say, limit_of, count
        self.recount_s, self.sleep = recount_s, sleep
        self.lock = threading.Lock()
        self.full_at: int | None = None  # the user's queued jobs when sbatch last refused
        self.full = False
        self.told: set[str] = set()
        self.refusals = 0  # sbatch refusals waited out, in all

    def refused(self, message: str) -> None:
        """sbatch refused a job for the limit: the queue is full until a job leaves it; or
        slurmctld did not answer: asked again after ``recount_s``. Each said once per
        workflow run (the progress line says how far the plan got)."""
        kind = waits_for(message) or "room"
        with self.lock:
            self.refusals += 1
            if self.full:
                return
            self.full = True
            self.full_at = self.count() if kind == "room" else None
            if kind in self.told:
                return
            self.told.add(kind)
            if kind == "controller":
                self.say(f"slurmctld does not answer sbatch ({sbatch_words(message)}): each "
                         f"submission is made again every {self.recount_s:g} s until it "
                         "answers (not a failed try)")
                return
            limit = self.limit_of()
            queued = "?" if self.full_at is None else self.full_at
            said = f"MaxSubmitJobs {limit}" if limit else sbatch_words(message)
            self.say(f"waiting: {queued} of your jobs queued, {said}: each submission "
                     "waits for one of your jobs to leave the queue and is made again "
                     "(not a failed try; your other jobs are left alone)")

    def wait(self) -> None:
        """Returns once a submission may be tried: at once unless the queue was found full;
        then when the user's queued jobs are fewer than at the refusal (or squeue does not
        answer: after one recount interval, and sbatch decides)."""
        with self.lock:
            while self.full:
                self.sleep(self.recount_s)
                if self.full_at is None:  # nothing to compare with: sbatch decides
                    self.full = False
                    break
                now = self.count()
                if now is None or now < self.full_at:
                    self.full = False
