"""A fused pack (``pack.fuse``): its members train in ONE process as one fused model
(engine/fused.py): one step of the allocation (cpus_per_task cores, one GPU) runs
``cifarflow train-fused``, which keeps each member's log, tries, checkpoint and exit status
as a member alone would, and reports them in a status file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..config import TrainConfig
from ..engine.checkpoint import atomic_write_text
from ..layout import RunPaths
from .members import (already_trained, line_writer, next_attempt, open_member_log,
                      publish_record, slurm_step)


def fused_argv(pack: str, k: int, members: list[str], results: str, data: str, until_epoch: int,
               threads: int, budget_min: float, mem_mb: int, stage: str, mode: str,
               status: Path) -> list[str]:
    """The fused group's one process: `cifarflow train-fused`."""
    return [sys.executable, "-m", "cifarflow", "train-fused", "--pack", pack, "--segment", str(k),
            "--results", results, "--data", data, "--until-epoch", str(until_epoch),
            "--threads", str(threads), "--budget-min", str(budget_min), "--mem-mb", str(mem_mb),
            "--stage-data", stage, "--mode", mode, "--status", str(status),
            "--members", *members]


def run_fused_pack(pack: str, k: int, members: list[str], results: str, data: str,
                   until_epoch: int, threads: int, budget_min: float, mem_per_cpu: int,
                   gpus: int, record: Path, stage: str, mode: str) -> int:
    """Segment k of a fused pack: its members not yet published, in one process (one Slurm
    step), then the record as for any pack."""
    report, todo = {}, []
    for run in members:
        manifest = already_trained(RunPaths(results, run), k, until_epoch)
        if manifest is None:
            todo.append(run)
            continue
        report[run] = {"trained": False, "exit": 0, "done": manifest["done"],
                       "epoch": manifest["epoch"]}
        print(f"[pack {pack}] {run}: segment {k} already published, not retrained", flush=True)
    if todo:
        status = Path(record).with_suffix(".status.json")
        status.parent.mkdir(parents=True, exist_ok=True)
        status.unlink(missing_ok=True)
        argv = fused_argv(pack, k, todo, results, data, until_epoch, threads, budget_min,
                          mem_per_cpu * threads, stage, mode, status)
        if os.environ.get("SLURM_JOB_ID"):
            argv = slurm_step(argv, pack, threads, mem_per_cpu, gpus)
        print(f"[pack {pack}] segment {k}: {len(todo)} member(s) fused in one process",
              flush=True)
        code = subprocess.call(argv)
        outcome = json.loads(status.read_text()) if status.is_file() else {}
        for run in todo:
            entry = outcome.get(run) or {"exit": code or 1, "error": f"the fused process ended "
                                         f"with exit status {code} before reporting"}
            report[run] = {"trained": True, **entry}
            if entry["exit"]:
                print(f"[pack {pack}] {run}: FAILED ({entry.get('error', '')})", flush=True)
            else:
                print(f"[pack {pack}] {run}: finished, epoch {entry['epoch']}"
                      f"{' (done)' if entry['done'] else ' (to be continued)'}", flush=True)
    return publish_record(pack, k, members, report, record)


def train_fused_members(pack: str, k: int, members: list[str], results: str, data: str,
                        until_epoch: int, threads: int, budget_min: float, mem_mb: int,
                        stage: str, mode: str, status: Path, start_time: float,
                        share_input: bool = True) -> int:
    """`cifarflow train-fused`: each member's log (its own try, as unpacked), its try in
    tries.jsonl, then the fused training; each member's outcome in ``status``."""
    from . import tries
    from ..engine.fused_train import train_fused
    from ..engine.segment import Segment
    from ..engine.usage import ended_as
    from ..engine.strategies import get_strategy
    from .takeover import Superseded, take_over

    outcome, segments, logs = {}, [], []
    for run in members:
        paths = RunPaths(results, run)
        attempt = next_attempt(paths, k)
        log = open_member_log(paths, k, attempt)
        logs.append(log)
        say = line_writer(log)
        run_dir = Path(paths.root)
        refused = tries.refusal(run_dir, k, attempt)
        if refused:
            say(f"cifarflow train-fused: error: {refused}")
            outcome[run] = {"exit": 2, "error": refused}
            continue
        try:
            take_over(run_dir, run, say=say)
        except Superseded as exc:
            say(f"cifarflow train-fused: {exc}")
            outcome[run] = {"exit": 3, "error": str(exc)}
            continue
        tries.record(run_dir, k, attempt, "start", fused=pack)
        cfg = TrainConfig.read(Path(paths.spec))
        segment = Segment(cfg, get_strategy(cfg.strategy)(cfg, threads), Path(data),
                          Path(paths.segment(k)), Path(paths.segment(k - 1)) if k > 1 else None,
                          Path(paths.work), until_epoch, budget_min, start_time, attempt,
                          mem_mb, stage, Path(paths.tensorboard))
        segment.report.stream, segment.report.sample_gpu = log, not segments
        segment.try_of = (run_dir, attempt)
        segments.append(segment)

    def say(line: str) -> None:
        print(f"[fused {pack}] {line}", flush=True)

    try:
        results_of = train_fused(segments, None if mode == "auto" else mode, start_time, say,
                                 share_input)
    except BaseException as exc:  # the whole group failed: every member's try says why
        for segment in segments:
            run_dir, attempt = segment.try_of
            ended = tries.OUT_OF_MEMORY if type(exc).__name__ in ("OutOfMemoryError",
                                                                 "MemoryError") else "failed"
            tries.record(run_dir, k, attempt, "end", ended=ended,
                         error=f"{type(exc).__name__}: {str(exc)[:300]}")
            segment.report.say(f"ERROR: the fused group failed: {type(exc).__name__}: {exc}")
        raise
    for segment in segments:
        run_dir, attempt = segment.try_of
        result = results_of[segment.cfg.run]
        if "error" in result:
            tries.record(run_dir, k, attempt, "end", ended=tries.USER_ERROR, error=result["error"])
            outcome[segment.cfg.run] = {"exit": 2, "error": result["error"]}
        else:
            tries.record(run_dir, k, attempt, "end", ended=ended_as(result["stopped"]))
            outcome[segment.cfg.run] = {"exit": 0, "done": result["done"],
                                        "epoch": result["epoch"], "attempt": attempt}
    for log in logs:
        log.close()
    atomic_write_text(status, json.dumps(outcome, indent=1) + "\n")
    return 0 if all(entry["exit"] == 0 for entry in outcome.values()) else 1
