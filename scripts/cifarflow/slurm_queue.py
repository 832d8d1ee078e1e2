"""What this workflow has in Slurm's queue (its pending jobs for the controller's watch and
a restarted workflow's takeover, every job of it at the end), and what the scheduler counts
(sdiag). Each question asked through slurm.ask, once here; slurm.py holds the rest. No torch."""

from __future__ import annotations

import os
import re

from . import slurm


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


# ---- this workflow's pending jobs (the controller's watch, a restarted workflow's takeover)
# squeue --me -t PD: job id, working directory, reason, comment (rule_...), partition,
# nodes asked, submit time
PENDING_FORMAT = "%i|%Z|%r|%k|%P|%n|%V"


def squeue_pending() -> str:
    return slurm.pending_jobs(PENDING_FORMAT)


def workflow_lines(squeue_out: str, fmt: str, workdir: str):
    """The fields of each line of squeue's ``fmt`` output (%Z, the working directory,
    second) of a job of this workflow: its working directory is the workflow's."""
    mine, width = os.path.realpath(workdir), fmt.count("|") + 1
    for line in squeue_out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == width and os.path.realpath(parts[1]) == mine:
            yield parts


def workflow_pending(squeue_out: str, workdir: str) -> list[dict]:
    """This workflow's pending jobs (`squeue --me -t PD -o PENDING_FORMAT`)."""
    found = []
    for parts in workflow_lines(squeue_out, PENDING_FORMAT, workdir):
        job, _, reason, comment, partition, nodes, submitted = parts
        found.append({"job": job, "reason": reason, "partition": partition,
                      "snakemake": comment.startswith("rule_"),  # the plugin's comment
                      "rule": comment.removeprefix("rule_") if comment != "(null)" else "",
                      "nodes": nodes if nodes != "(null)" else "",
                      "submitted": slurm.timestamp(submitted)})
    return found


# squeue --me, every state it lists (pending, running, completing, suspended): job id,
# working directory, comment (rule_...), state
QUEUED_FORMAT = "%i|%Z|%k|%T"


def workflow_queued(workdir: str) -> list[dict]:
    """This workflow's jobs still in the queue (any state squeue lists), that Snakemake
    submitted (comment rule_...): {"job", "rule", "state"}; [] where Slurm does not answer."""
    found = []
    reply = slurm.ask(["squeue", "--me", "-h", "-o", QUEUED_FORMAT])
    for job, _, comment, state in workflow_lines(reply.stdout, QUEUED_FORMAT, workdir):
        if comment.startswith("rule_") and state != "COMPLETING":  # leaving already
            found.append({"job": job, "rule": comment.removeprefix("rule_"), "state": state})
    return found


def earlier_jobs(squeue_out: str, workdir: str, before: float) -> list[dict]:
    """This workflow's pending jobs that Snakemake submitted before ``before`` (unix time):
    an earlier run of the workflow's (Snakemake locks the working directory, so its
    controller is gone)."""
    return [j for j in workflow_pending(squeue_out, workdir)
            if j["snakemake"] and j["submitted"] is not None and j["submitted"] < before]
