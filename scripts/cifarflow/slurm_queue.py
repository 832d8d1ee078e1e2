"""What this workflow has in Slurm's queue, and what the scheduler counts (sdiag).

A job is this workflow's because one of its controllers wrote its id down when it submitted
it (``JobRecord``: results/controller/jobs.jsonl), never because of its folder, name or
comment: a second Snakemake in the same folder, another config's workflow, the user's own
jobs are never this workflow's. The controller's pending watch, a restarted workflow's
takeover and the end of the workflow look up the recorded ids in one ``squeue --me``. Each
question asked through slurm.ask, once here; slurm.py holds the rest. No torch."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Container, Iterable

from . import slurm
from .files import read_jsonl
from .layout import jobs_record


# ---- what the scheduler counts (sdiag): the tests and bench/ measure the workflow by it
def rpc_counts() -> dict[str, int] | None:
    """slurmctld's RPC counts by message type since its last reset (sdiag), all clients
    together; None where sdiag does not answer."""
    reply = slurm.ask(["sdiag"])
    if not reply.ok:
        return None
    block = reply.stdout.partition("by message type")[2].partition("by user")[0]
    return {name: int(count) for name, count in
            re.findall(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)", block, flags=re.M)}


def reset_rpc_counts() -> bool:
    """sdiag -r (root or SlurmUser only): counts start again from zero."""
    return slurm.ask(["sdiag", "-r"]).ok


# ---- the record: which jobs this results folder's controllers submitted
class JobRecord:
    """One results folder's record, JSON lines appended by its controllers: "controller" when
    one took the working directory's lock (its invocation, host, pid, Slurm job, lock files),
    "job" for each job it submitted (id, rule), "cancelled" for one it saw cancelled from
    outside (id, rule, who, run), "end" when it ended. Jobs only read it."""

    def __init__(self, results: str):
        # absolute: Snakemake goes back to the folder it was started in before its exit
        self.path = Path(jobs_record(results)).absolute()
        self._write = threading.Lock()  # the submission thread and the main one

    def add(self, event: str, invocation: str, **fields) -> None:
        line = json.dumps({"event": event, "invocation": invocation, "time": round(time.time(), 3),
                           **fields}) + "\n"
        with self._write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:  # one write a line: whole lines, appended
                f.write(line)

    def entries(self) -> list[dict]:
        """Every entry, in order (a line cut short by a kill mid-write dropped)."""
        return read_jsonl(self.path) if self.path.is_file() else []

    def jobs(self, invocations: Container[str] | None = None,
             entries: list[dict] | None = None) -> dict[str, dict]:
        """Job id -> its entry, of these invocations of the workflow (every one: None)."""
        entries = self.entries() if entries is None else entries
        return {e["job"]: e for e in entries if e["event"] == "job" and
                (invocations is None or e["invocation"] in invocations)}

    def cancelled(self, entries: list[dict] | None = None) -> dict[str, dict]:
        """Job id -> its "cancelled" entry: jobs a controller saw cancelled from outside
        (scancel by someone, not by the workflow): their runs are reported cancelled."""
        entries = self.entries() if entries is None else entries
        return {e["job"]: e for e in entries if e["event"] == "cancelled"}

    def open_controllers(self, entries: list[dict] | None = None) -> list[dict]:
        """The controllers that took the lock and never said they ended, oldest first."""
        entries = self.entries() if entries is None else entries
        ended = {e["invocation"] for e in entries if e["event"] == "end"}
        return [e for e in entries if e["event"] == "controller" and e["invocation"] not in ended]


# ---- which of them Slurm still lists: squeue --me, every state it lists (pending, running,
# completing, suspended): job id, state, reason, comment (rule_...), partition, nodes asked,
# submit time
QUEUE_FORMAT = "%i|%T|%r|%k|%P|%n|%V"


def squeue_mine() -> str | None:
    """This user's queued jobs in QUEUE_FORMAT; None where Slurm does not answer."""
    return slurm.my_jobs(QUEUE_FORMAT)


def queued_of(squeue_out: str | None, owned: Container[str]) -> list[dict]:
    """The jobs of ``squeue_mine()`` whose ids are ``owned``: {"job", "state", "reason",
    "rule", "partition", "nodes", "submitted"}."""
    found = []
    for line in (squeue_out or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) != 7 or parts[0] not in owned:
            continue
        job, state, reason, comment, partition, nodes, submitted = parts
        found.append({"job": job, "state": state, "reason": reason, "partition": partition,
                      "rule": comment.removeprefix("rule_") if comment.startswith("rule_") else "",
                      "nodes": nodes if nodes != "(null)" else "",
                      "submitted": slurm.timestamp(submitted)})
    return found


def pending_of(squeue_out: str | None, owned: Container[str]) -> list[dict]:
    return [j for j in queued_of(squeue_out, owned) if j["state"] == "PENDING"]


def still_queued(owned: Iterable[str]) -> list[dict] | None:
    """Which of the ``owned`` jobs Slurm still lists, but those already leaving
    (COMPLETING); None where Slurm does not answer."""
    owned = set(owned)
    if not owned:
        return []
    out = squeue_mine()
    if out is None:
        return None
    return [j for j in queued_of(out, owned) if j["state"] != "COMPLETING"]
