"""One job, several sweep members: segment k of every member of a pack, at once.

Inside a Slurm allocation each member is a job step of its own (``srun --exact``: one task
of cpus_per_task cores, and one GPU where the strategy trains on one), so Slurm places the
members on the allocation's nodes and keeps them apart; outside Slurm they are child
processes, as many at once as the job's cores allow. Every member keeps its own log
(``segment-<k>.attempt<n>.log``; ``segment-<k>.log`` points at the latest), checkpoint,
metrics and exit status. The job fails if a member failed, once all others finished; its
retry trains only the members without a published segment k. The pack's record
(``results/packs/<pack>/segment-<k>.json``) is written last, when all members succeeded.

A fused pack (``pack.fuse``) trains its members in ONE process (fused_pack.py); an
MPS-shared pack (``pack.per_gpu`` M) runs them M at a time on each GPU under one private
MPS daemon (mps_pack.py). Each member's own process: members.py.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from ..engine.checkpoint import read_manifest
from ..engine.strategies.base import GPU_INDEX_ENV
from ..layout import RunPaths
from .fused_pack import run_fused_pack
from .members import (already_trained, member_argv, next_attempt, open_member_log,
                      publish_record, slurm_step)
from .mps_daemon import mps_dirs, private_daemon
from .mps_pack import GpuSlots, run_in_one_step, share_gpus_here


def run_pack(pack: str, k: int, members: list[str], results: str, data: str,
             until_epoch: int, threads: int, budget_min: float, mem_per_cpu: int,
             gpus: int, slots: int, record: Path, stage: str = "none",
             fuse: str | None = None, per_gpu: int = 1, in_step: bool = False,
             again: list[str] | None = None) -> int:
    """Segment k of the pack's members. ``again`` is this command, to run inside the one
    step of an MPS-shared pack (``per_gpu`` > 1), where ``in_step`` is set."""
    if fuse:
        return run_fused_pack(pack, k, members, results, data, until_epoch, threads,
                              budget_min, mem_per_cpu, gpus, record, stage, fuse)
    in_slurm = bool(os.environ.get("SLURM_JOB_ID"))
    shared = None
    if per_gpu > 1:
        if in_slurm and not in_step:
            return run_in_one_step(pack, k, members, threads, mem_per_cpu, per_gpu, again)
        shared = share_gpus_here(pack, k, members, results, until_epoch, per_gpu, in_step)
        if shared is None:
            return 2
        slots = len(members) if in_step else max(1, slots // max(1, threads))
        with private_daemon(mps_dirs()) as env:
            return train_members(pack, k, members, results, data, until_epoch, threads,
                                 budget_min, mem_per_cpu, gpus, slots, record, stage,
                                 steps=False, shared=shared, env=env)
    slots = len(members) if in_slurm else max(1, slots // max(1, threads))
    return train_members(pack, k, members, results, data, until_epoch, threads, budget_min,
                         mem_per_cpu, gpus, slots, record, stage, steps=in_slurm)


def train_members(pack: str, k: int, members: list[str], results: str, data: str,
                  until_epoch: int, threads: int, budget_min: float, mem_per_cpu: int,
                  gpus: int, slots: int, record: Path, stage: str, steps: bool,
                  shared: GpuSlots | None = None, env: dict | None = None) -> int:
    """Each member as its own process (a Slurm step of its own where ``steps``), ``slots``
    at once and, on GPUs ``shared`` through MPS, where ``shared`` has room."""
    print(f"[pack {pack}] segment {k}: {len(members)} member(s), "
          f"{'one Slurm step each' if steps else f'{slots} at a time'}", flush=True)
    report, waiting, running = {}, list(members), {}
    while waiting or running:
        while waiting and len(running) < slots and (shared is None or shared.free()):
            run = waiting.pop(0)
            paths = RunPaths(results, run)
            manifest = already_trained(paths, k, until_epoch)
            if manifest is not None:
                report[run] = {"trained": False, "exit": 0, "done": manifest["done"],
                               "epoch": manifest["epoch"]}
                print(f"[pack {pack}] {run}: segment {k} already published, not retrained",
                      flush=True)
                continue
            attempt = next_attempt(paths, k)
            argv = member_argv(paths, k, data, until_epoch, threads, budget_min, attempt,
                               mem_per_cpu * threads, stage)
            if steps:
                argv = slurm_step(argv, run, threads, mem_per_cpu, gpus)
            place, member_env, where = None, env, ""
            if shared:  # its GPU, as one of its sharers, and its own cores
                place = shared.take()
                member_env = {**env, GPU_INDEX_ENV: str(place[0])}
                if "SLURM_CPUS_PER_TASK" in member_env:  # the step's: all members' cores
                    member_env["SLURM_CPUS_PER_TASK"] = str(threads)
                where = f", GPU {place[0]}, sharer {place[1]} of {shared.per_gpu}"
            attempt_log = Path(paths.attempt_log(k, attempt))
            with open_member_log(paths, k, attempt) as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                        env=member_env)
            running[run] = (proc, attempt, attempt_log, place)
            print(f"[pack {pack}] {run}: started (attempt {attempt}, log {attempt_log}{where})",
                  flush=True)
        for run, (proc, attempt, attempt_log, place) in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            del running[run]
            if place:
                shared.give(place[0])
            entry = {"trained": True, "exit": code, "attempt": attempt}
            if code == 0:
                manifest = read_manifest(Path(RunPaths(results, run).segment(k)), verify=False)
                entry.update(done=manifest["done"], epoch=manifest["epoch"])
                print(f"[pack {pack}] {run}: finished, epoch {manifest['epoch']}"
                      f"{' (done)' if manifest['done'] else ' (to be continued)'}", flush=True)
            else:
                tail = attempt_log.read_text(errors="replace").strip().splitlines()[-1:]
                print(f"[pack {pack}] {run}: FAILED with exit status {code} ({attempt_log}"
                      f"{': ' + tail[0] if tail else ''})", flush=True)
            report[run] = entry
        if running:
            time.sleep(0.2)
    return publish_record(pack, k, members, report, record)
