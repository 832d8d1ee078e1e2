"""A fix for Snakemake itself, applied by the workflow's main process (workflow.py).

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
