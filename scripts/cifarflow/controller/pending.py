"""Jobs that wait for what will never come: while the workflow runs on Slurm, a daemon
thread of its main process asks squeue for this user's jobs now and then, keeps the pending
ones this controller submitted (ownership.py records them), and names each one
pending for a reason that does not clear by itself, once; one that waits for a
maintenance reservation is named too, with the reservation's end, and left to start. No torch
here."""

from __future__ import annotations

import functools
import threading
from typing import Callable, Container

from .. import slurm
from ..slurm_queue import pending_of, squeue_mine
from .partitions import expand_hostlist

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
NODE_NOT_AVAIL = "ReqNodeNotAvail"  # down or drained: stuck; reserved for maintenance: waits
MAINTENANCE = "Reserved for maintenance"  # Slurm's words when a MAINT reservation blocks it

def maintenance_of(job: dict, reservations: list[dict],
                   partition_nodes: Callable[[str], str] = lambda name: "") -> str | None:
    """What a job pending for ReqNodeNotAvail waits for where that is a maintenance (it
    ends by itself): the MAINT reservation on the nodes Slurm names unavailable, else on
    those the job asks, else on its partition's; None where no maintenance holds them (a
    node is down or drained)."""
    listed = job["reason"].partition("UnavailableNodes:")[2].strip()
    hosts = set(expand_hostlist(listed or job["nodes"] or partition_nodes(job["partition"])))
    held = [r for r in reservations if "MAINT" in r.get("Flags", "").split(",") and
            ("ALL_NODES" in r.get("Flags", "").split(",") or
             hosts & set(expand_hostlist(r.get("Nodes", ""))))]
    if held:
        last = max(held, key=lambda r: r.get("EndTime", ""))
        return (f"maintenance reservation {last['ReservationName']} on {last.get('Nodes')} "
                f"until {last.get('EndTime', 'an end Slurm does not say')}")
    return "a maintenance reservation" if MAINTENANCE in job["reason"] else None


def stuck_jobs(squeue_out: str | None, owned: Container[str],
               maintenance: Callable[[dict], str | None] = lambda job: None) -> list[dict]:
    """This workflow's pending jobs whose reason will not clear by itself, and those that
    wait for a maintenance (``maintenance(job)`` says which, for ReqNodeNotAvail: "what"
    it waits for, else None)."""
    found = []
    for job in pending_of(squeue_out, owned):
        word = job["reason"].split(",")[0].strip("()").split(" ")[0]
        why = STUCK.get(word)
        if why:
            waits = maintenance(job) if word == NODE_NOT_AVAIL else None
            found.append({**job, "why": why, "maintenance": waits})
    return found


def describe(job: dict) -> str:
    what = f" ({job['rule']})" if job["rule"] else ""
    pending = (f"Slurm job {job['job']}{what} is pending for {job['reason']} in partition "
               f"{job['partition']}")
    if job.get("maintenance"):
        return (f"{pending}: it waits for the {job['maintenance']}, and starts by itself "
                "when the maintenance ends")
    return (f"{pending}: {job['why']}; it will not start by itself: "
            f"scancel {job['job']}, then change the request or the partition (snakemake -n "
            "checks the plan against the partition)")


def partition_nodes(name: str) -> str:
    return slurm.partition(name).get("Nodes", "")


class PendingWatch:
    """Polls squeue every `interval_s` seconds from a daemon thread, while `active()` (the
    workflow submits to Slurm); says each stuck job once through `say`, and each job that
    waits for a maintenance (asking `reservations()` then, once a look)."""

    def __init__(self, owned: Container[str], say: Callable[[str], None],
                 interval_s: float = 60, query: Callable[[], str | None] = squeue_mine,
                 active: Callable[[], bool] = lambda: True,
                 reservations: Callable[[], list[dict]] = slurm.reservations,
                 nodes_of: Callable[[str], str] = partition_nodes):
        self.owned, self.say, self.interval_s, self.query = owned, say, interval_s, query
        self.active = active  # asked at each look: Snakemake knows its executor only then
        self.reservations, self.nodes_of = reservations, nodes_of
        self.named: set[str] = set()
        self.stopped = threading.Event()

    def poll(self) -> list[str]:
        if not self.owned:
            return []  # nothing submitted yet: nothing to ask squeue about
        lines, asked = [], functools.cache(self.reservations)

        def maintenance(job: dict) -> str | None:
            if job["job"] in self.named:
                return None  # named already: nothing more to ask
            return maintenance_of(job, asked(), self.nodes_of)

        for job in stuck_jobs(self.query(), self.owned, maintenance):
            if job["job"] not in self.named:
                self.named.add(job["job"])
                lines.append(describe(job))
        for line in lines:
            self.say(line)
        return lines

    def start(self) -> "PendingWatch":
        every(self.interval_s, self.poll, self.active, "cifarflow-pending-watch", self.stopped)
        return self


def every(interval_s: float, look: Callable[[], object], active: Callable[[], bool], name: str,
          stopped: threading.Event | None = None, at_once: bool = False) -> threading.Thread:
    """`look()` every `interval_s` seconds (and `at_once`) while `active()`, from a daemon
    thread of the workflow's main process (it ends with the process, or when `stopped` is
    set)."""
    stopped = stopped or threading.Event()

    def loop():
        if at_once and active():
            look()
        while not stopped.wait(interval_s):
            if active():
                look()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread
