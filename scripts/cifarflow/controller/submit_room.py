"""Room in the user's share of the queue while the workflow runs, and a controller that
does not answer sbatch (issue 55).

Slurm's submit limit (MaxSubmitJobs of an association, MaxSubmitPU of a QOS; 1000 on most
Alliance sites) counts every job of the user: a second sweep, an interactive session, an
array submitted by hand take from it too. `snakemake -n` checks the plan against the limit
(limits.py); this is what happens when the queue is full anyway. An sbatch that Slurm
refuses for the limit is not a failed try: the submission waits until the user's queued
jobs are fewer than the limit (one ``squeue --me`` count every ``recount_s`` per waiting
submission) and is made again, without using a retry; where that cannot be known (no limit
read, squeue silent, or jobs under the user's other accounts counted against a per-account
limit) sbatch itself is asked again every ``retry_s``: a submission never waits forever.
An sbatch that finds no slurmctld (restarted for maintenance) is made again every
``recount_s``. Nothing is asked of Slurm while no sbatch is refused.

``share_the_submit_limit`` is the fix of the Slurm plugin that puts this between its
submission threads and sbatch (docs/slurm.md, "Fixes of Snakemake and its Slurm plugin").
"""

from __future__ import annotations

import re
import threading
import time
from typing import Callable

from .. import slurm
from . import snakemake_fixes as fixes

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
    Slurm's accounting sets (None: unknown), asked only once a submission is refused. No
    thread waits holding what another needs: each waiting submission counts for itself."""

    def __init__(self, say: Callable[[str], None], limit_of: Callable[[], int | None],
                 count: Callable[[], int | None] = count_my_jobs, recount_s: float = 10.0,
                 retry_s: float = 60.0, sleep: Callable[[float], None] = time.sleep):
        self.say, self.limit_of, self.count = say, limit_of, count
        self.recount_s, self.retry_s, self.sleep = recount_s, retry_s, sleep
        self.lock = threading.Lock()
        self.full = False  # sbatch refused a submission since one was last accepted
        self.waiting_for = "room"  # what the last refusal waits for (waits_for)
        self.limit: int | None = None  # asked at the first refusal for the limit
        self.told: set[str] = set()
        self.refusals = 0  # sbatch refusals waited out, in all

    def refused(self, message: str) -> None:
        """sbatch refused a job for the limit: the queue is full until a job leaves it; or
        slurmctld did not answer: asked again after ``recount_s``. Each said once per
        workflow run (the progress line says how far the plan got)."""
        kind = waits_for(message) or "room"
        with self.lock:
            self.refusals += 1
            self.full, self.waiting_for = True, kind
            first = kind not in self.told
            self.told.add(kind)
        if not first:
            return
        if kind == "controller":
            self.say(f"slurmctld does not answer sbatch ({sbatch_words(message)}): each "
                     f"submission is made again every {self.recount_s:g} s until it "
                     "answers (not a failed try)")
            return
        self.limit = self.limit_of()
        queued = self.count()
        said = f"MaxSubmitJobs {self.limit}" if self.limit else sbatch_words(message)
        self.say(f"waiting: {'?' if queued is None else queued} of your jobs queued, {said}: "
                 "each submission waits for one of your jobs to leave the queue and is made "
                 "again (not a failed try; your other jobs are left alone)")

    def accepted(self) -> None:
        """sbatch took a job: there is room again."""
        self.full = False

    def wait(self) -> None:
        """Returns once a submission may be tried: at once unless sbatch refused one since
        the last it took; then, for a full queue, once the user's queued jobs are fewer than
        the limit, or after ``retry_s`` whatever the count (no limit known, squeue silent,
        jobs of the user's other accounts counted): sbatch decides; for a silent slurmctld,
        after one interval."""
        waited = 0.0
        while self.full:
            self.sleep(self.recount_s)
            waited += self.recount_s
            if not self.full or self.waiting_for == "controller" or waited >= self.retry_s:
                return
            queued = self.count() if self.limit else None
            if queued is not None and queued < self.limit:
                return


SUBMITTING = threading.local()  # the job this submission thread submits, and its refusal


def share_the_submit_limit(room: SubmitRoom) -> None:
    """The Slurm plugin (2.8) reports an sbatch refused for the user's submit limit
    (AssocMaxSubmitJobLimit: the queue already holds as many of the user's jobs as Slurm
    allows, many of them perhaps not this workflow's) as the job's failure: Snakemake retries
    it at once, it is refused again, and the workflow fails with runs trained and no summary.
    Here such a refusal never reaches Snakemake: the submission waits for room (``room``,
    shared by the plugin's submission threads) and is made again; so is an sbatch that found
    no slurmctld (restarted for maintenance); any other refusal is reported as before. The
    plugin's submission threads drop what their task raises: anything this fix raises is
    reported as the job's error instead of leaving the job unsubmitted and the workflow
    waiting on it."""
    import snakemake_executor_plugin_slurm as plugin
    from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

    fixes.LISTENERS["room"] = room
    run = fixes.patched(plugin.Executor, "run_job", fixes.SLURM)
    report = fixes.patched(plugin.Executor, "_report_job_error_threadsafe",
                           fixes.SLURM)
    if getattr(run, "cifarflow_fix", False):
        return

    def _report_job_error_threadsafe(self, job_info, msg, *args, **kwargs):
        if getattr(SUBMITTING, "job", None) is job_info.job and waits_for(str(msg)):
            SUBMITTING.refused = str(msg)
            return
        report(self, job_info, msg, *args, **kwargs)

    def run_job(self, job):
        SUBMITTING.job = job
        try:
            while True:
                fixes.LISTENERS["room"].wait()
                SUBMITTING.refused = None
                run(self, job)
                if SUBMITTING.refused is None:
                    fixes.LISTENERS["room"].accepted()
                    return
                fixes.LISTENERS["room"].refused(SUBMITTING.refused)
        except Exception as error:  # noqa: BLE001 - the plugin's thread pool would drop it
            report(self, SubmittedJobInfo(job), f"cifarflow could not submit it: {error!r}")
        finally:
            SUBMITTING.job = None

    run_job.cifarflow_fix = True
    plugin.Executor._report_job_error_threadsafe = _report_job_error_threadsafe
    plugin.Executor.run_job = run_job
