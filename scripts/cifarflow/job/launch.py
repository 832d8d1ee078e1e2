"""Start N copies of a command: ``srun`` inside a Slurm allocation, ``torchrun`` outside
(the command itself for one process).

The training rules start every segment under it, so the same rule works under
``--profile profiles/slurm`` (one task per rank, rank from SLURM_PROCID) and with
``snakemake --cores N`` on a laptop (torchrun sets RANK/WORLD_SIZE/MASTER_*)."""

from __future__ import annotations

import os
import shlex
import sys

from ..slurm import job_tasks


def launch_argv(nproc: int, command: list[str], nodes: int = 1, cpus_per_task: int = 1,
                self_spawning: bool = False, environ=os.environ, tasks_of=job_tasks,
                gpus_per_task: int = 0) -> list[str]:
    if environ.get("SLURM_JOB_ID"):
        ntasks = tasks_of(environ["SLURM_JOB_ID"])
        if ntasks is not None and ntasks != nproc:
            raise SystemExit(f"launch: the Slurm job has {ntasks} tasks but the run needs "
                             f"{nproc}; set tasks/tasks_per_node to {nproc}")
        # explicit step geometry: srun inherits none of it (Slurm >= 22.05 and the
        # jobstep's cleaned environment); Lightning reads SLURM_NTASKS_PER_NODE
        bind = [f"--gpus-per-task={gpus_per_task}"] if gpus_per_task else []
        return ["srun", "--kill-on-bad-exit=1", f"--nodes={nodes}", f"--ntasks={nproc}",
                f"--ntasks-per-node={nproc // nodes}", f"--cpus-per-task={cpus_per_task}",
                *bind, *command]
    if self_spawning or nproc == 1:  # Lightning spawns its own workers; one is the command
        return list(command)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "--no-python", *command]


def world_of(command: list[str]) -> tuple[int, int]:
    """(processes, nodes) of the run whose spec.json the command trains (its ``--spec``):
    read when the segment starts, so the rule's command line is the same whatever the world
    size, and a change of it under segments.elastic leaves the finished segments standing."""
    import json
    from pathlib import Path

    spec = next((arg.split("=", 1)[1] if "=" in arg else command[i + 1]
                 for i, arg in enumerate(command) if arg.split("=")[0] == "--spec"), None)
    if spec is None:
        raise SystemExit("launch: give --nproc, or a command with --spec (a run's spec.json)")
    cfg = json.loads(Path(spec).read_text())
    return int(cfg["world_size"]), int(cfg["nodes"])


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="cifarflow launch")
    p.add_argument("--nproc", type=int, help="processes (default: the command's --spec says)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--cpus-per-task", type=int, default=1)
    p.add_argument("--gpus-per-task", type=int, default=0,
                   help="srun binds each task to this many of the job's GPUs (0: none)")
    p.add_argument("--self-spawning", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    nproc, nodes = (a.nproc, a.nodes) if a.nproc else world_of(command)
    argv = launch_argv(nproc, command, nodes, a.cpus_per_task, a.self_spawning,
                       gpus_per_task=a.gpus_per_task)
    print(f"[launch] {shlex.join(argv)}", flush=True)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
