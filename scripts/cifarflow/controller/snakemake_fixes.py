"""Fixes for Snakemake itself and its Slurm executor plugin, applied by the workflow's main
process (WorkflowPlan.start_main_process, workflow.py). Each wraps a name it finds through
``patched``, which raises an error naming the package, its release and the way out where a
release lacks it: a fix never stops applying without a word (``TARGETS`` lists them all;
tests/unit/test_status_checks.py checks them against the installed modules). What each
answers upstream: docs/slurm.md, "Fixes of Snakemake and its Slurm plugin".

Snakemake 9 (seen with 9.27.1) loses a job it restarts (``--retries``, the Slurm profile's
``retries: 2``) when a checkpoint finishes before the restart is scheduled: the restarted
job stays in the DAG's set of running jobs, so the DAG's re-evaluation after the checkpoint
drops it from the ready jobs and never adds it back; the workflow ends with "BUG: Out of
jobs ready to be started". Every segment is a checkpoint, so a retried segment and a
finishing one meet often in a sweep. The restarted job is not running: take it out of that
set. ``tests/integration/test_snakemake_fixes.py`` reproduces the loss without the fix."""

from __future__ import annotations

import time

from ..job.snakemake_start import layout_changed

SNAKEMAKE, SLURM = "snakemake", "snakemake-executor-plugin-slurm"
INTERFACE = "snakemake-interface-executor-plugins"
JOBSTEP = "snakemake-executor-plugin-slurm-jobstep"

# every (module, owner in it or "", name, package) a fix wraps or relies on
TARGETS = (
    ("snakemake.scheduling.job_scheduler", "JobScheduler", "_handle_error", SNAKEMAKE),
    ("snakemake.persistence", "PersistenceBase", "lock", SNAKEMAKE),
    ("snakemake_executor_plugin_slurm", "", "get_min_job_age", SLURM),
    ("snakemake_executor_plugin_slurm", "", "validate_account", SLURM),
    ("snakemake_executor_plugin_slurm", "", "get_job_wildcards", SLURM),
    ("snakemake_executor_plugin_slurm", "", "get_default_partition", SLURM),
    ("snakemake_executor_plugin_slurm", "", "query_job_status", SLURM),
    ("snakemake_executor_plugin_slurm", "Executor", "check_active_jobs", SLURM),
    ("snakemake_executor_plugin_slurm", "Executor", "report_job_submission", SLURM),
    ("snakemake_executor_plugin_slurm", "Executor", "run_job", SLURM),
    ("snakemake_executor_plugin_slurm", "Executor", "_report_job_error_threadsafe", SLURM),
    ("snakemake_executor_plugin_slurm", "Executor", "report_job_success", INTERFACE),
    ("snakemake_executor_plugin_slurm", "Executor", "report_job_error", INTERFACE),
    ("snakemake_executor_plugin_slurm", "Executor", "get_python_executable", INTERFACE),
    ("snakemake_executor_plugin_slurm.job_status_query", "", "get_min_job_age", SLURM),
    ("snakemake_executor_plugin_slurm_jobstep", "Executor", "get_python_executable", JOBSTEP),
)


def patched(owner, name: str, package: str):
    """``owner.name``, which a fix wraps; a clear error where this release lacks it."""
    original = getattr(owner, name, None)
    if original is None:
        raise layout_changed(f"{getattr(owner, '__name__', owner)}.{name}", package)
    return original


NOT_RETRIED: set = set()  # Snakemake jobs that fail for good: cancelled from outside


def keep_restarted_jobs_ready() -> None:
    """The restarted job out of the running set (above); and a job in NOT_RETRIED (cancelled
    from outside: notice_outages_and_cancellations) is not restarted, whatever --retries
    says: retries are for faults, a scancel is someone's decision."""
    from snakemake.scheduling.job_scheduler import JobScheduler

    original = patched(JobScheduler, "_handle_error", SNAKEMAKE)
    if getattr(original, "cifarflow_fix", False):
        return

    def _handle_error(self, job, *args, **kwargs):
        dag = self.workflow.dag
        for name in ("_ready_jobs", "_running"):
            if not hasattr(dag, name):
                raise layout_changed(f"DAG.{name}", SNAKEMAKE)
        if job in NOT_RETRIED:  # no restart left: Snakemake fails it for good
            NOT_RETRIED.discard(job)
            job.attempt = max(job.attempt, job.restart_times + 1)
        original(self, job, *args, **kwargs)
        if job in dag._ready_jobs:  # restarted, not failed for good
            dag._running.discard(job)

    _handle_error.cifarflow_fix = True
    JobScheduler._handle_error = _handle_error


def ask_the_scheduler_once() -> None:
    """The Slurm executor plugin (2.8) asks the controller again what does not change while a
    workflow runs: ``scontrol show config`` (MinJobAge) at every status check, and
    ``sacctmgr list user`` (the account's check) at every submission; each `scontrol show
    config` is two RPCs (the configuration and a ping). Asked once per process here: the
    first answer is kept (issue 47; tests/slurm/test_slurm_rpcs.py counts them)."""
    import snakemake_executor_plugin_slurm as plugin

    for name in ("get_min_job_age", "validate_account"):
        original = patched(plugin, name, SLURM)
        if getattr(original, "cifarflow_fix", False):
            continue
        answers: dict = {}

        def once(*args, _original=original, _answers=answers, **kwargs):
            key = args[:1]  # the account (its logger is not part of the question)
            if key not in _answers:
                _answers[key] = _original(*args, **kwargs)
            return _answers[key]

        once.cifarflow_fix = True
        setattr(plugin, name, once)


def start_jobs_quietly() -> None:
    """Each job's Snakemake starts through job/snakemake_start.py, which keeps the plugin
    from asking ``scontrol show config`` as Snakemake imports it (twice per job: 4 RPCs,
    issue 47)."""
    import snakemake_executor_plugin_slurm as plugin

    from ..job.snakemake_start import start_through_this_file

    patched(plugin.Executor, "get_python_executable", INTERFACE)
    start_through_this_file(plugin.Executor)


LISTENERS: dict = {}  # what the fixes below tell, set by the process's latest call


def tell_when_locked(on_locked) -> None:
    """``on_locked(lock files)`` once Snakemake holds the working directory's lock, before it
    submits anything (never where the lock is refused: LockException, nor in a dry run or
    with --nolock, where Snakemake does not take it)."""
    import contextlib

    from snakemake.persistence import PersistenceBase

    LISTENERS["locked"] = on_locked
    original = patched(PersistenceBase, "lock", SNAKEMAKE)
    if getattr(original, "cifarflow_fix", False):
        return

    @contextlib.contextmanager
    def lock(self):
        with original(self):
            LISTENERS["locked"](list(getattr(self, "_lockfile", {}).values()))  # file backend
            yield

    lock.cifarflow_fix = True
    PersistenceBase.lock = lock


def job_label(job, describe) -> str:
    """A Snakemake job as the plugin's comment names it, less "rule_"."""
    wildcards = describe(job)
    return f"{job.name}_wildcards_{wildcards}" if wildcards else job.name


def tell_each_submission(on_submitted) -> None:
    """``on_submitted(job id, rule)`` for each job the Slurm plugin submitted (as it reports
    the submission to Snakemake)."""
    import snakemake_executor_plugin_slurm as plugin

    LISTENERS["submitted"] = on_submitted
    original = patched(plugin.Executor, "report_job_submission", SLURM)
    if getattr(original, "cifarflow_fix", False):
        return

    describe = patched(plugin, "get_job_wildcards", SLURM)

    def report_job_submission(self, job_info):
        if job_info.external_jobid:
            LISTENERS["submitted"](str(job_info.external_jobid),
                                   job_label(job_info.job, describe))
        original(self, job_info)

    report_job_submission.cifarflow_fix = True
    plugin.Executor.report_job_submission = report_job_submission


def let_the_site_route() -> None:
    """The Slurm plugin (2.8) passes ``-p <the default partition>`` (sinfo's ``*``) to every
    job that names none, which bypasses a site's routing (Alliance's submit plugin places a
    job that names no partition by its time and GPUs; the default partition may not hold it
    at all). A job that names no partition is submitted without one: Slurm gives it the
    default partition by itself where the site does not route."""
    import snakemake_executor_plugin_slurm as plugin

    original = patched(plugin, "get_default_partition", SLURM)
    if getattr(original, "cifarflow_fix", False):
        return

    def get_default_partition(job, logger):
        return ""

    get_default_partition.cifarflow_fix = True
    plugin.get_default_partition = get_default_partition


# ---- status checks that survive an accounting outage and notice a scancel ---------------
CANCELLED_HERE = "CIFARFLOW_CANCELLED"  # the plugin keeps a state it does not know as active
QUEUE_ENDED_OK = ("COMPLETED",)


def who_cancelled(state: str) -> str:
    """sacct's ``CANCELLED by <uid>`` as a person: "alice (uid 1000)"; squeue says no uid."""
    import pwd

    uid = state.partition(" by ")[2].strip()
    if not uid:
        return "someone (Slurm does not say who)"
    try:
        return f"{pwd.getpwuid(int(uid)).pw_name} (uid {uid})"
    except (KeyError, ValueError):
        return f"uid {uid}"


class StatusWatch:
    """One executor's state between its status checks: since when accounting is silent."""

    def __init__(self, say, queue_states, clock=time.monotonic):
        self.say, self.queue_states, self.clock = say, queue_states, clock
        self.silent_since: float | None = None
        self.queue_silent = False

    def accounting_silent(self, jobs: int) -> None:
        if self.silent_since is None:
            self.silent_since = self.clock()
            self.say(f"Slurm's accounting (the status command, sacct) does not answer: the "
                     f"{jobs} job(s) of this workflow are kept as they were, squeue asked for "
                     "their state, no try counted failed; the workflow goes on when it answers")

    def accounting_answers(self) -> None:
        if self.silent_since is not None:
            self.say(f"Slurm's accounting answers again (silent {self.clock() - self.silent_since:.0f} s)")
            self.silent_since = None

    def queue(self, jobs: list[str]) -> dict[str, str]:
        states = self.queue_states(jobs)
        if states is None:
            if not self.queue_silent:
                self.say("squeue does not answer either (slurmctld restarting?): the jobs "
                         "are kept as they were and asked again at the next status check")
            self.queue_silent = True
            return {}
        self.queue_silent = False
        return states


def notice_outages_and_cancellations(say, on_cancelled, queue_states=None) -> None:
    """The Slurm plugin (2.8) drops every job it checks when its status command fails at each
    of its ``status_attempts``: its check_active_jobs yields a job only from an answer, and
    the executor interface keeps only what it yields, so with no answer Snakemake waits for
    those jobs forever and no status check runs again. And sacct names a job cancelled with
    scancel ``CANCELLED by <uid>``, which is not one of the plugin's failure states: the job
    is yielded as running, forever. Here, around each status check:

    - a job the plugin neither reported nor kept (its status command did not answer) is
      kept; ``say`` says once that accounting does not answer and once that it answers
      again; squeue is asked for those jobs: one it lists COMPLETED is reported done, one it
      lists CANCELLED is treated as below, the rest are kept;
    - a failed status question is not asked again within the same check (5 tries of 60 s
      each held the check for 5 minutes while sacct hung);
    - a CANCELLED job (scancel, a second command, the site) is reported failed with one line
      naming its id, rule and wildcards and who cancelled, is not retried (NOT_RETRIED), and
      ``on_cancelled(job id, rule, who, wildcards)`` records it (the summary row of each run
      it trains, a pack's members too: cancelled)."""
    import snakemake_executor_plugin_slurm as plugin

    from .. import slurm

    LISTENERS["say"], LISTENERS["cancelled"] = say, on_cancelled
    LISTENERS["queue_states"] = queue_states or slurm.queue_states
    check = patched(plugin.Executor, "check_active_jobs", SLURM)
    if getattr(check, "cifarflow_fix", False):
        return
    query = patched(plugin, "query_job_status", SLURM)
    describe = patched(plugin, "get_job_wildcards", SLURM)
    report_success = patched(plugin.Executor, "report_job_success", INTERFACE)
    report_error = patched(plugin.Executor, "report_job_error", INTERFACE)
    this_check: dict = {}  # the check under way: its failed question, the cancelled jobs

    async def query_job_status(command, logger):
        if this_check.get("failed"):
            return None, None
        answer, duration = await query(command, logger)
        if answer is None:
            this_check["failed"] = True
            return answer, duration
        for job, state in answer.items():
            if state.startswith("CANCELLED"):
                this_check["cancelled"][job] = state
                answer[job] = CANCELLED_HERE
        return answer, duration

    def report_job_success(self, job_info, *args, **kwargs):
        self.__dict__.setdefault("cifarflow_reported", set()).add(job_info.external_jobid)
        return report_success(self, job_info, *args, **kwargs)

    def report_job_error(self, job_info, *args, **kwargs):
        self.__dict__.setdefault("cifarflow_reported", set()).add(job_info.external_jobid)
        return report_error(self, job_info, *args, **kwargs)

    def cancelled(self, job_info, state: str) -> None:
        job, who = job_info.job, who_cancelled(state)
        label = job_label(job, describe)
        NOT_RETRIED.add(job)
        line = (f"Slurm job {job_info.external_jobid} ({label}) was cancelled by {who}, not "
                "by this workflow: its run is reported cancelled and not retried (--retries "
                "are for faults)")
        wildcards = {k: str(v) for k, v in (getattr(job, "wildcards_dict", None) or {}).items()}
        LISTENERS["cancelled"](str(job_info.external_jobid), label, who, wildcards)
        self.report_job_error(job_info, msg=line + ". ")

    async def check_active_jobs(self, active_jobs):
        watch = self.__dict__.get("cifarflow_watch")
        if watch is None:
            watch = self.cifarflow_watch = StatusWatch(LISTENERS["say"],
                                                       LISTENERS["queue_states"])
        this_check.clear()
        this_check["cancelled"] = {}
        reported = self.__dict__.setdefault("cifarflow_reported", set())
        reported.clear()
        kept = [job_info async for job_info in check(self, active_jobs)]
        kept_ids = {j.external_jobid for j in kept}
        for job_info in kept:
            state = this_check["cancelled"].get(job_info.external_jobid)
            if state is None:
                yield job_info
            else:
                cancelled(self, job_info, state)
        dropped = [j for j in active_jobs
                   if j.external_jobid not in kept_ids and j.external_jobid not in reported]
        if not dropped:
            if active_jobs and not this_check.get("failed"):
                watch.accounting_answers()
            return
        watch.accounting_silent(len(active_jobs))
        states = watch.queue([str(j.external_jobid) for j in dropped])
        for job_info in dropped:
            state = states.get(str(job_info.external_jobid), "")
            if state in QUEUE_ENDED_OK:
                self.report_job_success(job_info)
            elif state.startswith("CANCELLED"):
                cancelled(self, job_info, state)
            else:
                yield job_info

    check_active_jobs.cifarflow_fix = True
    plugin.query_job_status = query_job_status
    plugin.Executor.report_job_success = report_job_success
    plugin.Executor.report_job_error = report_job_error
    plugin.Executor.check_active_jobs = check_active_jobs
