"""One job, several sweep members: segment k of every member of a pack, at once.

Inside a Slurm allocation each member is a job step of its own (``srun --exact``: one task
of cpus_per_task cores, and one GPU where the strategy trains on one), so Slurm places the
members on the allocation's nodes and keeps them apart; outside Slurm they are child
processes, as many at once as the job's cores allow. Every member keeps its own log
(``segment-<k>.attempt<n>.log``; ``segment-<k>.log`` points at the latest), checkpoint,
metrics and exit status. The job fails if a member failed, once all others finished; its
retry trains only the members without a published segment k. The pack's record
(``results/packs/<pack>/segment-<k>.json``) is written last, when all members succeeded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .checkpoint import CheckpointError, atomic_write_text, read_manifest
from .config import TrainConfig
from .layout import RunPaths, attempt_logs_pattern, attempt_number, try_args


def member_argv(paths: RunPaths, k: int, data: str, until_epoch: int, threads: int,
                budget_min: float, attempt: int, mem_mb: int, stage: str = "none") -> list[str]:
    """The member's `cifarflow train`, exactly as an unpacked segment job runs it."""
    return [sys.executable, "-m", "cifarflow", "train",
            *paths.train_args(k, data=data, until_epoch=until_epoch, stage=stage),
            *try_args(threads, budget_min, mem_mb, attempt)]


def slurm_step(argv: list[str], run: str, cpus: int, mem_per_cpu: int, gpus: int) -> list[str]:
    """The member as one step of the allocation: its own cores, memory and GPU."""
    step = ["srun", "--exact", "--ntasks=1", "--nodes=1", f"--cpus-per-task={cpus}",
            f"--mem-per-cpu={mem_per_cpu}", "--kill-on-bad-exit=1", f"--job-name={run}"]
    if gpus:
        step.append(f"--gres=gpu:{gpus}")
    return step + argv


def next_attempt(paths: RunPaths, k: int) -> int:
    """This member's own try of segment k: one more than the logs of its earlier tries
    (a member that succeeded is not retried when another member failed)."""
    logs = Path(paths.logs)
    tries = logs.glob(attempt_logs_pattern(f"segment-{k}")) if logs.is_dir() else []
    return max(filter(None, (attempt_number(p.name) for p in tries)), default=0) + 1


def already_trained(paths: RunPaths, k: int, until_epoch: int) -> dict | None:
    """The manifest of the member's published segment k if it is complete, verified and of
    this run's config and target (an earlier try of this pack job trained it)."""
    try:
        manifest = read_manifest(Path(paths.segment(k)))
    except CheckpointError:
        return None
    config_hash = TrainConfig.read(Path(paths.spec)).shaping_hash()
    if manifest.get("config_hash") != config_hash or manifest.get("until_epoch") != until_epoch:
        return None
    return manifest


def run_pack(pack: str, k: int, members: list[str], results: str, data: str,
             until_epoch: int, threads: int, budget_min: float, mem_per_cpu: int,
             gpus: int, slots: int, record: Path, stage: str = "none") -> int:
    in_slurm = bool(os.environ.get("SLURM_JOB_ID"))
    slots = len(members) if in_slurm else max(1, slots // max(1, threads))
    print(f"[pack {pack}] segment {k}: {len(members)} member(s), "
          f"{'one Slurm step each' if in_slurm else f'{slots} at a time'}", flush=True)
    report, waiting, running = {}, list(members), {}
    while waiting or running:
        while waiting and len(running) < slots:
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
            if in_slurm:
                argv = slurm_step(argv, run, threads, mem_per_cpu, gpus)
            log = Path(paths.log(k))
            log.parent.mkdir(parents=True, exist_ok=True)
            attempt_log = Path(paths.attempt_log(k, attempt))
            with open(attempt_log, "w") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
            if log.is_symlink() or log.exists():
                log.unlink()
            log.symlink_to(attempt_log.name)
            running[run] = (proc, attempt, attempt_log)
            print(f"[pack {pack}] {run}: started (attempt {attempt}, log {attempt_log})",
                  flush=True)
        for run, (proc, attempt, attempt_log) in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            del running[run]
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
    failed = sorted(run for run, entry in report.items() if entry["exit"] != 0)
    if failed:
        print(f"[pack {pack}] segment {k}: {len(failed)} of {len(members)} member(s) failed: "
              f"{', '.join(failed)}; a retry trains only these", flush=True)
        return 1
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(record, json.dumps({
        "pack": pack, "segment": k, "members": report,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", "")}, indent=1) + "\n")
    print(f"[pack {pack}] segment {k}: all {len(members)} member(s) published", flush=True)
    return 0
