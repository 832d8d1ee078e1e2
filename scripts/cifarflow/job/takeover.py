"""The controller died, its jobs live on: never two tries training one run at once.

When the login session running Snakemake is lost, its Slurm jobs keep training. The rerun
(the same command: the dead controller's lock is replaced, controller/ownership.py) submits the unfinished segments again. Each
new try, before it trains, looks in the run's ``tries.jsonl`` for a try of an earlier run
of the workflow that never ended and whose Slurm job (or, outside Slurm, process on this
host) is still alive: it cancels it, waits until it has ended (a cancelled segment
checkpoints at its next batch, as on preemption), and then resumes from that checkpoint as
any retry does. A try that finds a newer run of the workflow's try of the same run is the
stale one: it ends at once without training. One log line says which.

Where a run holds tries of an earlier run of the workflow, the try also cancels the jobs
that earlier runs of the workflow recorded submitting (slurm_queue.JobRecord, in the results
folder) and that still pend: each would otherwise start, hold its allocation (a GPU while its
venv builds) and end at once, or train beside this run. Only jobs of that record: never a
job of another results folder, of the user's, or of a second Snakemake in this folder that
never held its lock (it submitted nothing). No torch."""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import slurm
from ..jobfacts import job_id
from ..slurm_queue import JobRecord, pending_of, squeue_mine
from .tries import INVOCATION, read

WAIT_S = 600  # the longest a cancelled try may take to checkpoint and end
# looks at a cancelled job: after 2 s, 4 s, 8 s ..., then every 30 s (20 takeovers at
# once ask the controller a few times a minute each, not once a second)
POLL_S, POLL_MAX_S = 2.0, 30.0
PENDING_ASKED: set[str] = set()  # runs of the workflow whose pending jobs this process saw to


class Superseded(RuntimeError):
    """A newer run of the workflow trains this run: this try must not."""


def started_at(invocation: str) -> float:
    """When a run of the workflow started (its invocation is '<unix time>.<pid>')."""
    try:
        return float(invocation.split(".")[0])
    except (ValueError, IndexError):
        return 0.0


def open_tries(entries: list[dict]) -> list[dict]:
    """Starts without their end, newest last (rank 0 writes both)."""
    ends = {(e.get("invocation"), e["segment"], e["attempt"], e.get("job_id"))
            for e in entries if e["event"] == "end"}
    return [e for e in entries if e["event"] == "start" and
            (e.get("invocation"), e["segment"], e["attempt"], e.get("job_id")) not in ends]


def process_argv(pid: int) -> list[bytes]:
    """The command line of a process on this host; [] where there is none (it ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def process_alive(entry: dict) -> bool:
    """A try outside Slurm: its process, on this host, still a `cifarflow train` (or a
    fused pack's `cifarflow train-fused`)."""
    if entry.get("host") != socket.gethostname() or not entry.get("pid"):
        return False
    argv = process_argv(entry["pid"])
    return (any(a in (b"train", b"train-fused") for a in argv)
            and any(b"cifarflow" in a for a in argv))


def alive(entry: dict) -> bool:
    """Its Slurm job still listed (no answer from squeue: assumed alive, and the cancel and
    the wait decide), or its process still running."""
    if entry.get("job_id"):
        return slurm.job_alive(entry["job_id"]) is not False
    return process_alive(entry)


def cancel(entry: dict) -> None:
    if entry.get("job_id"):
        slurm.cancel(entry["job_id"])
    else:  # and wake it if it was stopped (Ctrl-Z, SIGSTOP): it must act on the SIGTERM
        os.kill(entry["pid"], signal.SIGTERM)
        os.kill(entry["pid"], signal.SIGCONT)


def backoff(first: float, most: float):
    """Waits between looks: ``first``, doubling, at most ``most``."""
    wait = first
    while True:
        yield wait
        wait = min(most, wait * 2)


def cancel_earlier_pending(mine: str, results, say=print, query=squeue_mine,
                           stop=slurm.cancel) -> list[str]:
    """Cancel the pending jobs that runs of the workflow started before run ``mine`` recorded
    submitting to ``results`` (an earlier run's, whose controller is gone); their ids."""
    record = JobRecord(str(results))
    earlier = {e["invocation"] for e in record.entries()
               if started_at(e["invocation"]) < started_at(mine)}
    owned = record.jobs(earlier)
    jobs = [j["job"] for j in pending_of(query(), owned)] if owned else []
    if jobs:
        stop(*jobs)
        say(f"[takeover] cancelled {len(jobs)} pending Slurm job(s) an earlier run of the "
            f"workflow queued: {' '.join(jobs)} (this run of the workflow queues its own)")
    return jobs


def describe(entry: dict) -> str:
    return (f"Slurm job {entry['job_id']}" if entry.get("job_id") else
            f"process {entry.get('pid')} on {entry.get('host')}")


@dataclass(frozen=True)
class Reach:
    """What a takeover does to an earlier run of the workflow's jobs: looks whether a try
    lives, cancels it, cancels that run's pending jobs (a test hands in its own)."""
    is_alive: Callable[[dict], bool] = alive
    stop: Callable[[dict], None] = cancel
    cancel_pending: Callable = cancel_earlier_pending


@dataclass(frozen=True)
class Patience:
    """How long a takeover waits for a cancelled try to end, how often it looks, and the
    clock it waits by (a test's own: no machine's speed counts)."""
    wait_s: float = WAIT_S
    poll_s: float = POLL_S
    poll_max_s: float = POLL_MAX_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def take_over(run_dir, run: str, say=print, reach: Reach = Reach(),
              patience: Patience = Patience(), environ=os.environ) -> None:
    """Before a try of ``run`` trains (rank 0): cancel an earlier run of the workflow's try
    that still trains it and wait for its end, looking at it less and less often; cancel
    what that run of the workflow still has pending; raise Superseded where a newer run of
    the workflow trains ``run``."""
    is_alive, stop, wait_s = reach.is_alive, reach.stop, patience.wait_s
    clock, sleep = patience.clock, patience.sleep
    mine = environ.get(INVOCATION, "")
    if not mine:
        return  # not started by the workflow (a test, a hand-made command)
    entries = read(run_dir)  # the run's tries.jsonl, once
    newer = [e for e in entries if started_at(e.get("invocation", "")) > started_at(mine)]
    if newer:  # this try was queued by a controller that died, and the run went on without it
        raise Superseded(f"{run} is trained by a newer run of the workflow ({describe(newer[-1])}, "
                         f"segment {newer[-1]['segment']}): this try of an earlier one does not train")
    me = job_id()
    if me and mine not in PENDING_ASKED and \
            any(e.get("invocation") not in ("", mine) for e in entries):
        PENDING_ASKED.add(mine)  # once: a fused pack's members ask for one job
        results = Path(run_dir).parent.parent  # results/runs/<run>
        reach.cancel_pending(mine, results, say)  # a restart: the earlier controller's queue
    for entry in reversed(open_tries(entries)):
        theirs = entry.get("invocation", "")
        if not theirs or theirs == mine or (me and entry.get("job_id") == me):
            continue  # this run of the workflow's own tries (a requeue of this very job)
        who = describe(entry)
        if not is_alive(entry):
            continue  # it died with its controller, or ended: its checkpoint is there
        say(f"[takeover] {run}: {who} (segment {entry['segment']}, attempt "
            f"{entry['attempt']}, of an earlier run of the workflow) still trains it: "
            "cancelling it, then resuming from its checkpoint")
        stop(entry)
        t0 = clock()
        for pause in backoff(patience.poll_s, patience.poll_max_s):
            if not is_alive(entry):
                break
            if clock() - t0 > wait_s:
                raise Superseded(f"{who} did not end within {wait_s} s of its cancel: not "
                                 f"training {run} beside it")
            sleep(pause)
        say(f"[takeover] {run}: {who} ended after {clock() - t0:.1f} s")
