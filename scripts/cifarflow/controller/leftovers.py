"""Nothing of the workflow's left in the queue: when the main Snakemake process ends (all
done, failed, or Ctrl-C), the jobs of this working directory that Snakemake submitted and
that Slurm still lists are cancelled, each named in one line. Snakemake cancels the jobs it
still waits for; what it no longer knows of stays otherwise: a copy of a segment's job that
Slurm requeued after its batch script ended (the segment was published, Snakemake saw the
job complete), which would start later, hold an allocation and find its work done. A
controller killed outright (SIGKILL, a lost node) leaves them to the next run's takeover
(job/takeover.py). No torch here."""

from __future__ import annotations

import sys
from typing import Callable

from .. import slurm, slurm_queue


def say_at_exit(line: str) -> None:
    """A line when the process ends, where Snakemake's logger may be closed already."""
    print(f"[cifarflow] {line}", file=sys.stderr, flush=True)


def leave_no_job_behind(workdir: str, say: Callable[[str], None] = say_at_exit,
                        queued=slurm_queue.workflow_queued, cancel=slurm.cancel) -> list[str]:
    """Cancel this workflow's jobs Slurm still lists; their ids (one line says which)."""
    left = queued(workdir)
    if not left:
        return []
    jobs = [j["job"] for j in left]
    reply = cancel(*jobs)
    named = ", ".join(f"{j['job']} ({j['rule']}, {j['state']})" for j in left)
    if reply.ok:
        say(f"the workflow ended with {len(jobs)} job(s) of its own still in Slurm's queue, "
            f"which nothing waits for: cancelled {named}")
    else:
        say(f"WARNING: the workflow ended with {len(jobs)} job(s) of its own still in Slurm's "
            f"queue ({named}), and scancel failed ({reply.detail}): scancel {' '.join(jobs)}")
    return jobs
