"""Fixes for Snakemake itself and its Slurm executor plugin, applied by the workflow's main
process (WorkflowPlan.start_main_process, workflow.py).

Snakemake 9 (seen with 9.27.1) loses a job it restarts (``--retries``, the Slurm profile's
``retries: 2``) when a checkpoint finishes before the restart is scheduled: the restarted
job stays in the DAG's set of running jobs, so the DAG's re-evaluation after the checkpoint
drops it from the ready jobs and never adds it back; the workflow ends with "BUG: Out of
jobs ready to be started". Every segment is a checkpoint, so a retried segment and a
finishing one meet often in a sweep. The restarted job is not running: take it out of that
set. ``tests/integration/test_snakemake_fixes.py`` reproduces the loss without the fix."""

from __future__ import annotations


def keep_restarted_jobs_ready() -> None:
    from snakemake.scheduling.job_scheduler import JobScheduler

    original = JobScheduler._handle_error
    if getattr(original, "cifarflow_fix", False):
        return

    def _handle_error(self, job, *args, **kwargs):
        original(self, job, *args, **kwargs)
        dag = self.workflow.dag
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
        original = getattr(plugin, name, None)
        if original is None or getattr(original, "cifarflow_fix", False):
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

    start_through_this_file(plugin.Executor)


def patched(owner, name: str, package: str):
    """``owner.name``, which a fix wraps; a clear error where this release lacks it."""
    original = getattr(owner, name, None)
    if original is None:
        from importlib.metadata import version

        raise RuntimeError(
            f"cifarflow cannot apply its fix to {package} {version(package)}: "
            f"{getattr(owner, '__name__', owner)}.{name} is not there. Install the release "
            "constraints.txt pins (pip install -c constraints.txt ...), or report this")
    return original


LISTENERS: dict = {}  # what the two fixes below tell, set by the process's latest call


def tell_when_locked(on_locked) -> None:
    """``on_locked(lock files)`` once Snakemake holds the working directory's lock, before it
    submits anything (never where the lock is refused: LockException, nor in a dry run or
    with --nolock, where Snakemake does not take it)."""
    import contextlib

    from snakemake.persistence import PersistenceBase

    LISTENERS["locked"] = on_locked
    original = patched(PersistenceBase, "lock", "snakemake")
    if getattr(original, "cifarflow_fix", False):
        return

    @contextlib.contextmanager
    def lock(self):
        with original(self):
            LISTENERS["locked"](list(getattr(self, "_lockfile", {}).values()))  # file backend
            yield

    lock.cifarflow_fix = True
    PersistenceBase.lock = lock


def tell_each_submission(on_submitted) -> None:
    """``on_submitted(job id, rule)`` for each job the Slurm plugin submitted (as it reports
    the submission to Snakemake)."""
    import snakemake_executor_plugin_slurm as plugin

    LISTENERS["submitted"] = on_submitted
    original = patched(plugin.Executor, "report_job_submission",
                       "snakemake-executor-plugin-slurm")
    if getattr(original, "cifarflow_fix", False):
        return

    describe = patched(plugin, "get_job_wildcards", "snakemake-executor-plugin-slurm")

    def report_job_submission(self, job_info):
        if job_info.external_jobid:  # named as the plugin's comment names it, less "rule_"
            job, wildcards = job_info.job, describe(job_info.job)
            LISTENERS["submitted"](str(job_info.external_jobid),
                                   f"{job.name}_wildcards_{wildcards}" if wildcards else job.name)
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

    original = patched(plugin, "get_default_partition", "snakemake-executor-plugin-slurm")
    if getattr(original, "cifarflow_fix", False):
        return

    def get_default_partition(job, logger):
        return ""

    get_default_partition.cifarflow_fix = True
    plugin.get_default_partition = get_default_partition
