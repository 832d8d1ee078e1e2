"""An MPS-shared pack (``pack.per_gpu`` M): its members run M at a time on each GPU under one
private MPS daemon (mps_daemon.py). A Slurm step's GPUs are its own, so in a Slurm job the
driver starts ONE step holding the node's GPUs and the members' cores (``srun --gres=gpu:G
cifarflow train-pack ... --in-step``: the same order, in_step set); there, and outside Slurm, it starts the daemon and
the members as child processes (pack.train_members), each pinned to its GPU
(``CIFARFLOW_CUDA_DEVICE``), with its own log, try, checkpoint and exit status."""

from __future__ import annotations

import os
import subprocess
import sys

from ..engine.gpu_monitor import visible_gpus
from ..layout import RunPaths
from ..orders import PackOrder
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


def run_in_one_step(order: PackOrder) -> int:
    """An MPS-shared pack in a Slurm job: one step holding the node's GPUs (one per per_gpu
    members) and every member's cores runs this driver again (the order, in_step), which
    starts the daemon and the members."""
    step = one_step(order)
    print(f"[pack {order.pack}] segment {order.segment}: {len(order.members)} member(s), "
          f"{order.per_gpu} per GPU under MPS: one Slurm step holds the node's GPUs and starts "
          f"them: {' '.join(step)}", flush=True)
    return subprocess.call(step)


def one_step(order: PackOrder) -> list[str]:
    """The MPS-shared pack's one step: its node's ceil(members / per_gpu) GPUs, every
    member's cores and memory, running the driver again inside it."""
    members = len(order.members)
    return slurm_step(order.replace(in_step=True).command(), order.pack,
                      order.threads * members, order.mem_per_cpu,
                      mps_gpus(members, order.per_gpu))


def share_gpus_here(order: PackOrder) -> GpuSlots | None:
    """The GPUs the members share here, after saying where each member of the first wave
    trains; None, after one line saying why, where no GPU or no MPS is found."""
    pack, per_gpu = order.pack, order.per_gpu
    count = visible_gpus()
    where = (f"step {os.environ.get('SLURM_JOB_ID')}.{os.environ.get('SLURM_STEP_ID', '?')} on "
             if order.in_step else "") + os.uname().nodename
    dirs = mps_dirs()
    print(f"[pack {pack}] {where}: {count or 0} GPU(s) (CUDA_VISIBLE_DEVICES="
          f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}), {per_gpu} member(s) per GPU "
          f"under one private MPS daemon, CUDA_MPS_PIPE_DIRECTORY="
          f"{dirs['CUDA_MPS_PIPE_DIRECTORY']}", flush=True)
    problem = "no GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)" if not count else None
    if count:
        say_placement(order, GpuSlots(count, per_gpu))
        problem = gpu_problem()
    if problem:
        print(f"[pack {pack}] pack.per_gpu {per_gpu}: the members share GPUs through NVIDIA "
              f"MPS, but {problem}: run on a GPU node (profiles/slurm asks for GPUs) or set "
              "pack.per_gpu: 1", file=sys.stderr, flush=True)
        return None
    return GpuSlots(count, per_gpu)


def say_placement(order: PackOrder, slots: GpuSlots) -> None:
    """Where the first wave of members trains, as train_members places it (fresh slots)."""
    pack = order.pack
    todo = [run for run in order.members if already_trained(
        RunPaths(order.results, run), order.segment, order.until_epoch) is None]
    wave: dict[int, list[str]] = {}
    for run in todo:
        if not slots.free():
            break
        wave.setdefault(slots.take()[0], []).append(run)
    later = len(todo) - sum(map(len, wave.values()))
    print(f"[pack {pack}] placement: " + "; ".join(
        f"GPU {gpu}: {', '.join(runs)}" for gpu, runs in sorted(wave.items()))
        + (f"; then {later} more as GPUs free" if later else ""), flush=True)
