"""Jobs that wait for what will never come: while the workflow runs on Slurm, a daemon
thread of its main process asks squeue for this user's pending jobs now and then, keeps
those of this workflow (their working directory is the workflow's), and names each one
pending for a reason that does not clear by itself, once. No torch here."""

from __future__ import annotations

import os
import threading
from typing import Callable

from . import slurm

# squeue reasons a job keeps until someone changes it, the partition or the cluster
STUCK = {
    "PartitionConfig": "it asks more than the partition's nodes can ever give",
    "PartitionNodeLimit": "it asks more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit is above the partition's MaxTime",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "ReqNodeNotAvail": "a node it needs is unavailable (down, drained or reserved)",
    "BadConstraints": "its constraints can never be met",
    "InvalidAccount": "its account is invalid",
    "InvalidQOS": "its QOS is invalid",
    "QOSMaxCpuPerJobLimit": "it asks more CPUs than its QOS allows a job",
    "QOSMaxNodePerJobLimit": "it asks more nodes than its QOS allows a job",
    "QOSMaxWallDurationPerJobLimit": "its time limit is above its QOS's",
    "AssocMaxCpuPerJobLimit": "it asks more CPUs than your association allows a job",
    "AssocMaxWallDurationPerJobLimit": "its time limit is above your association's",
    "MaxMemPerLimit": "it asks more memory than the partition allows",
    "DependencyNeverSatisfied": "a job it depends on failed",
}
FORMAT = "%i|%Z|%r|%k|%P"  # job id, working directory, reason, comment (rule), partition


def stuck_jobs(squeue_out: str, workdir: str) -> list[dict]:
    """This workflow's pending jobs (`squeue --me -t PD -o FORMAT`) whose reason will not
    clear by itself."""
    found, mine = [], os.path.realpath(workdir)
    for line in squeue_out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or os.path.realpath(parts[1]) != mine:
            continue
        job, _, reason, comment, partition = parts
        why = STUCK.get(reason.split(",")[0].strip("()").split(" ")[0])
        if why:
            found.append({"job": job, "reason": reason, "why": why, "partition": partition,
                          "rule": comment.removeprefix("rule_") if comment != "(null)" else ""})
    return found


def describe(job: dict) -> str:
    what = f" ({job['rule']})" if job["rule"] else ""
    return (f"Slurm job {job['job']}{what} is pending for {job['reason']} in partition "
            f"{job['partition']}: {job['why']}; it will not start by itself: "
            f"scancel {job['job']}, then change the request or the partition (snakemake -n "
            "checks the plan against the partition)")


def squeue_pending() -> str:
    return slurm.pending_jobs(FORMAT)


class PendingWatch:
    """Polls squeue every `interval_s` seconds from a daemon thread, while `active()` (the
    workflow submits to Slurm); says each stuck job once through `say`."""

    def __init__(self, workdir: str, say: Callable[[str], None], interval_s: float = 60,
                 query: Callable[[], str] = squeue_pending,
                 active: Callable[[], bool] = lambda: True):
        self.workdir, self.say, self.interval_s, self.query = workdir, say, interval_s, query
        self.active = active  # asked at each look: Snakemake knows its executor only then
        self.named: set[str] = set()
        self.stopped = threading.Event()

    def poll(self) -> list[str]:
        lines = []
        for job in stuck_jobs(self.query(), self.workdir):
            if job["job"] not in self.named:
                self.named.add(job["job"])
                lines.append(describe(job))
        for line in lines:
            self.say(line)
        return lines

    def start(self) -> "PendingWatch":
        def loop():
            while not self.stopped.wait(self.interval_s):
                if self.active():
                    self.poll()

        threading.Thread(target=loop, name="cifarflow-pending-watch", daemon=True).start()
        return self
