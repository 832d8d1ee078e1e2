"""One job, several sweep members: segment k of every member of a pack, at once.

Inside a Slurm allocation the members are the tasks of ONE job step (pack_step.py: a task
of cpus_per_task cores each, and its own GPU where the strategy trains on one), so Slurm
places the members on the allocation's nodes and keeps them apart; outside Slurm they are child
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

from ..engine.checkpoints.files import read_manifest
from ..engine.cuda import GPU_INDEX_ENV
from ..layout import RunPaths
from ..orders import PackOrder
from .fused_pack import run_fused_pack
from .members import next_attempt, open_member_log, publish_record, to_train
from .mps_daemon import mps_dirs, private_daemon
from .mps_pack import GpuSlots, run_in_one_step, share_gpus_here
from .pack_step import train_in_one_step


def run_pack(order: PackOrder) -> int:
    """Segment k of the pack's members, as its order says: fused, MPS-shared (in a Slurm
    job, its one step runs the same order again, in_step), or a process each (in a Slurm
    job, the members as the tasks of one step: pack_step.py)."""
    if order.fuse:
        return run_fused_pack(order)
    in_slurm = bool(os.environ.get("SLURM_JOB_ID"))
    slots = len(order.members) if in_slurm else max(1, order.slots // max(1, order.threads))
    if order.per_gpu > 1:
        if in_slurm and not order.in_step:
            return run_in_one_step(order)
        shared = share_gpus_here(order)
        if shared is None:
            return 2
        if order.in_step:
            slots = len(order.members)
        with private_daemon(mps_dirs()) as env:
            return train_members(order, slots, steps=False, shared=shared, env=env)
    return train_members(order, slots, steps=in_slurm)


def train_members(order: PackOrder, slots: int, steps: bool, shared: GpuSlots | None = None,
                  env: dict | None = None) -> int:
    """Each member as its own process: the tasks of one Slurm step where ``steps``, else
    ``slots`` at once and, on GPUs ``shared`` through MPS, where ``shared`` has room."""
    pack, k = order.pack, order.segment
    how = "one Slurm step" if steps else f"{slots} at a time"
    print(f"[pack {pack}] segment {k}: {len(order.members)} member(s), {how}", flush=True)
    report, waiting = to_train(pack, k, order.members, order.results, order.until_epoch)
    if steps and waiting:
        for run, (attempt, code) in train_in_one_step(order, waiting).items():
            report[run] = ended_member(order, run, attempt, code)
        waiting = []
    running = {}
    while waiting or running:
        while waiting and len(running) < slots and (shared is None or shared.free()):
            run = waiting.pop(0)
            paths = RunPaths(order.results, run)
            attempt = next_attempt(paths, k)
            argv = order.member(run, attempt).command()
            place, member_env, where = None, env, ""
            if shared:  # its GPU, as one of its sharers, and its own cores
                place = shared.take()
                member_env = {**env, GPU_INDEX_ENV: str(place[0])}
                if "SLURM_CPUS_PER_TASK" in member_env:  # the step's: all members' cores
                    member_env["SLURM_CPUS_PER_TASK"] = str(order.threads)
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
            report[run] = ended_member(order, run, attempt, code)
        if running:
            time.sleep(0.2)
    return publish_record(pack, k, list(order.members), report, Path(order.record))


def ended_member(order: PackOrder, run: str, attempt: int, code: int) -> dict:
    """A member's entry in the pack's record, said in one line: its epoch where it
    published, its log's last line where it failed."""
    pack, k, paths = order.pack, order.segment, RunPaths(order.results, run)
    entry = {"trained": True, "exit": code, "attempt": attempt}
    if code == 0:
        manifest = read_manifest(Path(paths.segment(k)), verify=False)
        entry.update(done=manifest["done"], epoch=manifest["epoch"])
        print(f"[pack {pack}] {run}: finished, epoch {manifest['epoch']}"
              f"{' (done)' if manifest['done'] else ' (to be continued)'}", flush=True)
    else:
        log = Path(paths.attempt_log(k, attempt))
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
        print(f"[pack {pack}] {run}: FAILED with exit status {code} ({log}"
              f"{': ' + tail[0] if tail else ''})", flush=True)
    return entry
