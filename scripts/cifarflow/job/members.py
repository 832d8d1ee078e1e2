"""A pack member as its own process, whichever way its pack trains: as a Slurm step of the
allocation, its next try, whether an earlier try already published it (the one check every
kind of pack makes), its log, and the pack's record once every member succeeded. Its
`cifarflow train` is its order's (orders.PackOrder.member)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..config import TrainConfig
from ..engine.checkpoints.files import CheckpointError, atomic_write_text, read_manifest
from ..layout import RunPaths, attempt_logs_pattern, attempt_number


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


def to_train(pack: str, k: int, members, results: str, until_epoch: int) -> tuple[dict, list]:
    """(the report of the members an earlier try of this job already published, the members
    left to train), saying which were not retrained."""
    report, todo = {}, []
    for run in members:
        manifest = already_trained(RunPaths(results, run), k, until_epoch)
        if manifest is None:
            todo.append(run)
            continue
        report[run] = {"trained": False, "exit": 0, "done": manifest["done"],
                       "epoch": manifest["epoch"]}
        print(f"[pack {pack}] {run}: segment {k} already published, not retrained", flush=True)
    return report, todo


def publish_record(pack: str, k: int, members: list[str], report: dict, record: Path) -> int:
    """The pack's record once every member succeeded; else 1, naming the failed ones."""
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


def open_member_log(paths: RunPaths, k: int, attempt: int):
    """The member's log of this try (open for writing), and segment-<k>.log pointing at it."""
    log, attempt_log = Path(paths.log(k)), Path(paths.attempt_log(k, attempt))
    log.parent.mkdir(parents=True, exist_ok=True)
    stream = open(attempt_log, "w")
    if log.is_symlink() or log.exists():
        log.unlink()
    log.symlink_to(attempt_log.name)
    return stream


def line_writer(stream):
    """say(line): one line into the stream, flushed."""
    def say(line: str) -> None:
        stream.write(line + "\n")
        stream.flush()
    return say
