"""A CPU pack's members in ONE Slurm step per job (issue 47: a step per member cost the
scheduler three RPCs each: create, allocation info, complete). The pack's driver starts
``srun --ntasks=<members>`` of the same order with ``in_task`` set; Slurm places the tasks
on the allocation's nodes (its cores and memory per task) and each task trains the member
of its index (SLURM_PROCID): the member's own log, try, checkpoint and exit status, as a
step of its own gave it. ``--kill-on-bad-exit=0``: a member that fails never ends the
others; its exit status is written beside the pack's record and read by the driver.
GPU packs keep a step per member (each its own GPU); MPS-shared and fused packs already
run one step."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..layout import RunPaths
from ..orders import PackOrder
from .members import next_attempt, open_member_log

# what a member's `cifarflow train` must see of the step: one task, its rank 0 (a step of
# its own gave it these; a rank other than 0 records no try)
ONE_TASK = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "1",
            "SLURM_NPROCS": "1", "SLURM_STEP_NUM_TASKS": "1"}


def task_exit_file(order: PackOrder, run: str) -> Path:
    """Where the task of ``run`` writes its member's exit status."""
    return Path(order.record).with_name(f"segment-{order.segment}.{run}.exit")


def one_step_argv(order: PackOrder, todo: list[str]) -> list[str]:
    """The step that trains ``todo``: a task each, with a member's cores and memory."""
    return ["srun", f"--ntasks={len(todo)}", f"--cpus-per-task={order.threads}",
            f"--mem-per-cpu={order.mem_per_cpu}", "--kill-on-bad-exit=0",
            f"--job-name={order.pack}",
            *order.replace(members=tuple(todo), in_task=True).command()]


def run_member_task(order: PackOrder, environ=os.environ) -> int:
    """In the step: the member of this task's index, as its own `cifarflow train`."""
    run = order.members[int(environ["SLURM_PROCID"])]
    paths = RunPaths(order.results, run)
    attempt = next_attempt(paths, order.segment)
    with open_member_log(paths, order.segment, attempt) as out:
        out.write(f"[pack {order.pack}] {run}: task {environ['SLURM_PROCID']} of step "
                  f"{environ.get('SLURM_JOB_ID')}.{environ.get('SLURM_STEP_ID', '?')} on "
                  f"{os.uname().nodename}\n")
        out.flush()
        code = subprocess.call(order.member(run, attempt).command(), stdout=out,
                               stderr=subprocess.STDOUT, env={**environ, **ONE_TASK})
    task_exit_file(order, run).parent.mkdir(parents=True, exist_ok=True)
    task_exit_file(order, run).write_text(f"{attempt} {code}\n")
    return code


def train_in_one_step(order: PackOrder, todo: list[str]) -> dict[str, tuple[int, int]]:
    """Run the step; each member's (attempt, exit status): a task that wrote none (killed
    with its step) failed with the step's status."""
    for run in todo:
        task_exit_file(order, run).unlink(missing_ok=True)
    argv = one_step_argv(order, todo)
    print(f"[pack {order.pack}] segment {order.segment}: {len(todo)} member(s) in one Slurm "
          f"step: {' '.join(argv[:6])} ...", flush=True)
    code = subprocess.call(argv)
    ended = {}
    for run in todo:
        written = task_exit_file(order, run)
        if written.is_file():
            attempt, status = map(int, written.read_text().split())
            written.unlink()
        else:
            attempt, status = next_attempt(RunPaths(order.results, run), order.segment) - 1, \
                code or 1
        ended[run] = (attempt, status)
    return ended
