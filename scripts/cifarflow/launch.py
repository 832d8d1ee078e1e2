"""Start N copies of a command: ``srun`` inside a Slurm allocation, ``torchrun`` outside.

The training rules call it as ``{resources.mpi}``, so the same rule works under
``--profile profiles/slurm`` (one task per rank, rank from SLURM_PROCID) and with
``snakemake --cores N`` on a laptop (torchrun sets RANK/WORLD_SIZE/MASTER_*)."""

from __future__ import annotations

import os
import re
import shlex
import sys


def slurm_tasks(environ) -> int | None:
    """Tasks of this allocation: SLURM_NTASKS (-n) or tasks-per-node x nodes."""
    if environ.get("SLURM_NTASKS"):
        return int(environ["SLURM_NTASKS"])
    per_node = environ.get("SLURM_NTASKS_PER_NODE", "")
    if per_node:
        nodes = int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
        return int(re.match(r"\d+", per_node).group()) * nodes
    return None


def launch_argv(nproc: int, command: list[str], self_spawning: bool = False,
                environ=os.environ) -> list[str]:
    if environ.get("SLURM_JOB_ID"):
        ntasks = slurm_tasks(environ)
        if ntasks is None:
            raise SystemExit("launch: inside a Slurm job without tasks: request "
                             f"tasks/tasks_per_node = {nproc} (the workflow's resources do)")
        if ntasks != nproc:
            raise SystemExit(f"launch: the Slurm job has {ntasks} tasks but the run needs "
                             f"{nproc}; set tasks/tasks_per_node to {nproc}")
        cpus = environ.get("SLURM_CPUS_PER_TASK", "1")
        # srun no longer inherits --cpus-per-task from sbatch (Slurm >= 22.05)
        return ["srun", "--kill-on-bad-exit=1", f"--ntasks={ntasks}",
                f"--cpus-per-task={cpus}", *command]
    if self_spawning:  # Lightning starts its own worker processes outside Slurm
        return list(command)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "--no-python", *command]


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="cifarflow launch")
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--self-spawning", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    argv = launch_argv(a.nproc, command, a.self_spawning)
    print(f"[launch] {shlex.join(argv)}", flush=True)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
