"""An MPS-shared pack (``pack.per_gpu`` M): its members run M at a time on each GPU under one
private MPS daemon (mps_daemon.py). A Slurm step's GPUs are its own, so in a Slurm job the
driver starts ONE step holding the node's GPUs and the members' cores (``srun --gres=gpu:G
cifarflow train-pack ... --in-step``); there, and outside Slurm, it starts the daemon and
the members as child processes (pack.train_members), each pinned to its GPU
(``CIFARFLOW_CUDA_DEVICE``), with its own log, try, checkpoint and exit status."""

from __future__ import annotations

import os
import subprocess
import sys

from ..engine.gpu_monitor import visible_gpus
from ..layout import RunPaths
from .members import already_trained, slurm_step
from .mps_daemon import gpu_problem, mps_dirs, mps_gpus


class GpuSlots:
    """Where an MPS-shared pack's members train: at most ``per_gpu`` at once on each of
    ``gpus`` GPUs; a member takes the GPU with the fewest sharers (the lowest index first)
    and gives it back when it ends."""

    def __init__(self, gpus: int, per_gpu: int):
        self.per_gpu, self.sharers = per_gpu, [0] * gpus

    def free(self) -> bool:
        return min(self.sharers) < self.per_gpu

    def take(self) -> tuple[int, int]:
        """(GPU index, this member's place among its sharers, 1-based)."""
        gpu = self.sharers.index(min(self.sharers))
        self.sharers[gpu] += 1
        return gpu, self.sharers[gpu]

    def give(self, gpu: int) -> None:
        self.sharers[gpu] -= 1


def run_in_one_step(pack: str, k: int, members: list[str], threads: int, mem_per_cpu: int,
                    per_gpu: int, again: list[str]) -> int:
    """An MPS-shared pack in a Slurm job: one step holding the node's GPUs (one per per_gpu
    members) and every member's cores runs this driver again (``again``), which starts the
    daemon and the members."""
    step = one_step(again, pack, len(members), threads, mem_per_cpu, per_gpu)
    print(f"[pack {pack}] segment {k}: {len(members)} member(s), {per_gpu} per GPU under "
          f"MPS: one Slurm step holds the node's GPUs and starts them: {' '.join(step)}",
          flush=True)
    return subprocess.call(step)


def one_step(again: list[str], pack: str, members: int, threads: int, mem_per_cpu: int,
             per_gpu: int) -> list[str]:
    """The MPS-shared pack's one step: its node's ceil(members / per_gpu) GPUs, every
    member's cores and memory, running the driver again inside it."""
    return slurm_step([*again, "--in-step"], pack, threads * members, mem_per_cpu,
                      mps_gpus(members, per_gpu))


def share_gpus_here(pack: str, k: int, members: list[str], results: str, until_epoch: int,
                    per_gpu: int, in_step: bool) -> GpuSlots | None:
    """The GPUs the members share here, after saying where each member of the first wave
    trains; None, after one line saying why, where no GPU or no MPS is found."""
    count = visible_gpus()
    where = (f"step {os.environ.get('SLURM_JOB_ID')}.{os.environ.get('SLURM_STEP_ID', '?')} on "
             if in_step else "") + os.uname().nodename
    dirs = mps_dirs()
    print(f"[pack {pack}] {where}: {count or 0} GPU(s) (CUDA_VISIBLE_DEVICES="
          f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}), {per_gpu} member(s) per GPU "
          f"under one private MPS daemon, CUDA_MPS_PIPE_DIRECTORY="
          f"{dirs['CUDA_MPS_PIPE_DIRECTORY']}", flush=True)
    problem = "no GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)" if not count else None
    if count:
        say_placement(pack, k, members, results, until_epoch, GpuSlots(count, per_gpu))
        problem = gpu_problem()
    if problem:
        print(f"[pack {pack}] pack.per_gpu {per_gpu}: the members share GPUs through NVIDIA "
              f"MPS, but {problem}: run on a GPU node (profiles/slurm asks for GPUs) or set "
              "pack.per_gpu: 1", file=sys.stderr, flush=True)
        return None
    return GpuSlots(count, per_gpu)


def say_placement(pack: str, k: int, members: list[str], results: str, until_epoch: int,
                  slots: GpuSlots) -> None:
    """Where the first wave of members trains, as train_members places it (fresh slots)."""
    todo = [run for run in members if already_trained(RunPaths(results, run), k,
                                                       until_epoch) is None]
    wave: dict[int, list[str]] = {}
    for run in todo:
        if not slots.free():
            break
        wave.setdefault(slots.take()[0], []).append(run)
    later = len(todo) - sum(map(len, wave.values()))
    print(f"[pack {pack}] placement: " + "; ".join(
        f"GPU {gpu}: {', '.join(runs)}" for gpu, runs in sorted(wave.items()))
        + (f"; then {later} more as GPUs free" if later else ""), flush=True)
