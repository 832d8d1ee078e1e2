"""Every try of a segment, in the run's directory (``results/runs/<run>/tries.jsonl``, beside
the in-segment checkpoint ``work/``, which each save replaces): when it started,
in which Slurm job and Snakemake invocation, and how it ended. A try that was killed
(out of memory, node failure, time limit) writes no end: Slurm's state of its job says.

The workflow reads it to size a retry (more memory after an out-of-memory kill) and the
engine to refuse a retry that would fail again: an error a user must fix (exit status 2:
a bad config, a damaged checkpoint, missing data) is not the node's, the time limit's or
memory's fault, so a retry in the same invocation ends at once with that error. No torch."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from .. import slurm
from ..files import read_jsonl
from ..jobfacts import job_id
from ..layout import attempt_logs_pattern

TRIES = "tries.jsonl"
INVOCATION = "CIFARFLOW_INVOCATION"  # set by the workflow's main process, inherited by jobs
USER_ERROR = "error"                 # how a try that ended with an error to fix is recorded
OUT_OF_MEMORY = "out of memory"

# Slurm job states of a try that wrote no end (sacct / squeue --states=all)
SLURM_ENDS = {"OUT_OF_MEMORY": OUT_OF_MEMORY, "NODE_FAIL": "node failure", "TIMEOUT": "timeout",
              "PREEMPTED": "preempted", "CANCELLED": "cancelled", "FAILED": "killed",
              "BOOT_FAIL": "node failure", "DEADLINE": "timeout"}


def this_rank() -> int:
    for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(name):
            return int(os.environ[name])
    return 0


def record(run_dir, segment: int, attempt: int, event: str, **fields) -> None:
    """Append one line (one write, so ranks' lines never interleave)."""
    entry = {"segment": segment, "attempt": attempt, "event": event, "rank": this_rank(),
             "job_id": job_id(), "invocation": os.environ.get(INVOCATION, ""),
             "host": socket.gethostname(), "pid": os.getpid(), "time": time.time(), **fields}
    path = Path(run_dir) / TRIES
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def read(run_dir) -> list[dict]:
    """The run's entries (a line cut by a kill mid-write is dropped: files.read_jsonl)."""
    path = Path(run_dir) / TRIES
    return read_jsonl(path) if path.is_file() else []


# what Slurm writes into a step's output when it kills it for memory: the cgroup's OOM
# killer ("Detected 1 oom-kill event(s)", srun's "task 0: Out Of Memory"), the polling
# enforcement of jobacct_gather ("exceeded memory limit ..., being killed")
OOM_MARKERS = ("oom-kill", "Out Of Memory", "exceeded memory limit")


def killed_for_memory(logs_dir, segment: int, attempt: int) -> bool:
    """Whether the try's own log (segment-<k>.attempt<n>[.requeue<r>].log) says Slurm
    killed it for memory, where the job's state does not (the step's, not the job's)."""
    if not logs_dir:
        return False
    for log in Path(logs_dir).glob(attempt_logs_pattern(f"segment-{segment}", attempt)):
        try:
            with open(log, "rb") as f:
                f.seek(max(0, log.stat().st_size - 20000))
                tail = f.read().decode(errors="replace")
        except OSError:
            continue
        if any(marker in tail for marker in OOM_MARKERS):
            return True
    return False


def recorded(run_dir, segment: int | None, invocation: str) -> list[dict]:
    """The tries as tries.jsonl has them, oldest first: ``ended`` None where a try wrote
    no end (see tries_of)."""
    tries: list[dict] = []
    open_try: dict[int, dict] = {}  # segment -> its latest try
    for entry in read(run_dir):
        k = entry.get("segment")
        if (segment is not None and k != segment) or \
                (invocation and entry.get("invocation") != invocation):
            continue
        if entry["event"] == "start":
            open_try[k] = {"segment": k, "attempt": entry["attempt"],
                           "job_id": entry.get("job_id", ""), "ended": None, "error": None}
            tries.append(open_try[k])
        elif entry["event"] == "end" and open_try.get(k, {}).get("attempt") == entry["attempt"]:
            last = open_try[k]
            if last["ended"] != USER_ERROR:  # one rank's error to fix outweighs the rest
                last["ended"], last["error"] = entry["ended"], entry.get("error")
    return tries


def unended_jobs(tries: list[dict]) -> list[str]:
    return [t["job_id"] for t in tries if t["ended"] is None and t["job_id"]]


def tries_of(run_dir, segment: int | None, invocation: str | None = None, states_of=None,
             logs_dir=None) -> list[dict]:
    """The tries of ``segment`` (of all, for None) in this invocation (in all, where none
    is set), oldest first, each with how it ended: its own end record, else its Slurm
    job's state or what Slurm wrote in its log (``logs_dir``: the run's training logs)
    when it killed it for memory, else "killed". One try per start, whatever its ranks
    wrote. ``states_of(job ids)`` gives the states of the jobs of the tries without an
    end, asked once for them all (default: slurm.job_states; a summary of many runs asks
    once for all of them: ended_states)."""
    invocation = os.environ.get(INVOCATION, "") if invocation is None else invocation
    tries = recorded(run_dir, segment, invocation)
    jobs = unended_jobs(tries)
    states = (states_of or slurm.job_states)(jobs) if jobs else {}
    for t in tries:
        if t["ended"] is None:
            t["ended"] = SLURM_ENDS.get(states.get(t["job_id"], ""), "killed")
            if t["ended"] != OUT_OF_MEMORY and killed_for_memory(logs_dir, t["segment"],
                                                                 t["attempt"]):
                t["ended"] = OUT_OF_MEMORY
    return tries


def ended_states(run_dirs, states_of=None) -> dict[str, str]:
    """The Slurm states of the jobs of the tries without an end in these runs (of every
    invocation), in one question: a summary of a whole results tree hands them to each
    run's tries_of instead of asking once per run."""
    jobs = [job for d in run_dirs for job in unended_jobs(recorded(d, None, ""))]
    return (states_of or slurm.job_states)(jobs) if jobs else {}


def out_of_memory_count(run_dir, segment: int, **kw) -> int:
    return sum(1 for t in tries_of(run_dir, segment, **kw) if t["ended"] == OUT_OF_MEMORY)


def refusal(run_dir, segment: int, attempt: int, **kw) -> str | None:
    """Why this retry must not train: its previous try in this invocation ended with an
    error a user must fix. None for a first try and after any other end."""
    if attempt <= 1 or not os.environ.get(INVOCATION):
        return None
    tries = tries_of(run_dir, segment, states_of=lambda jobs: {}, **kw)
    if tries and tries[-1]["ended"] == USER_ERROR:
        last = tries[-1]
        return (f"segment {segment}: attempt {last['attempt']} failed with an error to fix, not "
                f"a fault of the node, the time limit or memory: {last['error']}; not retried "
                "(fix it, then run the workflow again)")
    return None
