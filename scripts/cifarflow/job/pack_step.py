"""A pack's members in ONE Slurm step per job (issue 47: a step per member cost the
scheduler three RPCs each: create, allocation info, complete). The pack's driver writes one
shell script and starts ``srun --ntasks=<members> sh <script>``; Slurm places the tasks on
the allocation's nodes (a member's cores and memory each, and with ``--gpus-per-task`` its
own GPUs: Slurm sets each task's CUDA_VISIBLE_DEVICES) and each task runs the member of
its index (SLURM_PROCID): the member's own `cifarflow train` (its order), as one task of
rank 0, appending to its own log, then its exit status into a file the driver reads. No
Python stands between the task and the member (its memory counts in the step's), and
``--kill-on-bad-exit=0``: a member that fails never ends the others. MPS-shared and fused
packs run one step of their own (mps_pack.py, fused_pack.py)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from ..layout import RunPaths
from ..orders import PackOrder
from .members import next_attempt, open_member_log

# what a member's `cifarflow train` must see of the step: one task, its rank 0 (a step of
# its own gave it these; a rank other than 0 records no try)
ONE_TASK = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "1",
            "SLURM_NPROCS": "1", "SLURM_STEP_NUM_TASKS": "1"}


def step_files(order: PackOrder) -> tuple[Path, Path]:
    """The step's script and the folder of its members' exit statuses, beside the record."""
    base = Path(order.record).with_suffix("")
    return base.with_name(base.name + ".step.sh"), base.with_name(base.name + ".exits")


def step_script(order: PackOrder, members: list[tuple[str, int]]) -> str:
    """Task i runs member i (its name, its attempt) and writes its exit status."""
    _, exits = step_files(order)
    one_task = " ".join(f"{k}={v}" for k, v in ONE_TASK.items())
    gpus = ", CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" if order.gpus else ""
    lines = ["#!/bin/sh", "# written by cifarflow train-pack: one task per member",
             'case "$SLURM_PROCID" in']
    for i, (run, attempt) in enumerate(members):
        paths = RunPaths(order.results, run)
        log = shlex.quote(paths.attempt_log(order.segment, attempt))
        train = shlex.join(order.member(run, attempt).command())
        lines += [f"  {i})", f'    echo "[pack {order.pack}] {run}: task $SLURM_PROCID of step '
                  f'$SLURM_JOB_ID.$SLURM_STEP_ID on $(hostname){gpus}" >> {log}',
                  f"    {one_task} {train} >> {log} 2>&1",
                  f"    echo $? > {shlex.quote(str(exits / run))} ;;"]
    return "\n".join(lines + ["esac", ""])


def one_step_argv(order: PackOrder, count: int) -> list[str]:
    """The step: a task per member, each a member's cores, memory and GPUs."""
    script, _ = step_files(order)
    gpus = [f"--gpus-per-task={order.gpus}"] if order.gpus else []
    return ["srun", f"--ntasks={count}", f"--cpus-per-task={order.threads}",
            f"--mem-per-cpu={order.mem_per_cpu}", *gpus, "--kill-on-bad-exit=0",
            f"--job-name={order.pack}", "sh", str(script)]


def train_in_one_step(order: PackOrder, todo: list[str]) -> dict[str, tuple[int, int]]:
    """Run the step; each member's (attempt, exit status): one that wrote none (killed
    with its step) failed with the step's status."""
    members = []
    for run in todo:  # each member's log of this try, and segment-<k>.log pointing at it
        attempt = next_attempt(RunPaths(order.results, run), order.segment)
        open_member_log(RunPaths(order.results, run), order.segment, attempt).close()
        members.append((run, attempt))
    script, exits = step_files(order)
    exits.mkdir(parents=True, exist_ok=True)
    for run in todo:
        (exits / run).unlink(missing_ok=True)
    script.write_text(step_script(order, members))
    argv = one_step_argv(order, len(members))
    print(f"[pack {order.pack}] segment {order.segment}: {len(members)} member(s) as the "
          f"tasks of one Slurm step: {' '.join(argv)}", flush=True)
    code = subprocess.call(argv)
    ended = {}
    for run, attempt in members:
        written = exits / run
        status = written.read_text().strip() if written.is_file() else ""
        ended[run] = (attempt, int(status) if status.lstrip("-").isdigit() else code or 1)
    return ended
