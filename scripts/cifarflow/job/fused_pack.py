"""A fused pack (``pack.fuse``): its members train in ONE process as one fused model
(engine/fused/, driven by engine/loop.py): one step of the allocation (cpus_per_task
cores, one GPU) runs ``cifarflow train-fused``, which keeps each member's log, tries,
checkpoint and exit status as a member alone would, and reports them in a status file."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

from ..engine.checkpoints.files import atomic_write_text
from ..layout import RunPaths
from ..orders import FusedOrder, PackOrder
from .members import line_writer, next_attempt, open_member_log, publish_record, slurm_step
from .members import to_train
from .one_try import TryRefused, recorded_try


def run_fused_pack(order: PackOrder) -> int:
    """Segment k of a fused pack: its members not yet published, in one process (one Slurm
    step), then the record as for any pack."""
    pack, k = order.pack, order.segment
    report, todo = to_train(pack, k, order.members, order.results, order.until_epoch)
    if todo:
        status = Path(order.record).with_suffix(".status.json")
        status.parent.mkdir(parents=True, exist_ok=True)
        status.unlink(missing_ok=True)
        argv = order.fused(todo, status).command()
        if os.environ.get("SLURM_JOB_ID"):
            argv = slurm_step(argv, pack, order.threads, order.mem_per_cpu, order.gpus)
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
    return publish_record(pack, k, list(order.members), report, Path(order.record))


def train_fused_members(order: FusedOrder, start_time: float) -> int:
    """`cifarflow train-fused`: each member's log (its own try, as unpacked), its try
    (job/one_try.py, as a run alone: refused, taken over, started, ended), then the order
    handed to the engine with the logs of the members that may train; each member's
    outcome in the order's status file."""
    from ..engine.run import run_fused

    outcome, logs, says, tried = {}, {}, {}, {}
    with contextlib.ExitStack() as stack:
        for run in order.members:
            paths = RunPaths(order.results, run)
            attempt = next_attempt(paths, order.segment)
            log = stack.enter_context(open_member_log(paths, order.segment, attempt))
            says[run] = say = line_writer(log)
            try:
                tried[run] = stack.enter_context(recorded_try(
                    Path(paths.root), order.member(run, attempt).out, attempt, say=say,
                    fused=order.pack))
            except TryRefused as exc:
                say(exc.line("train-fused"))
                outcome[run] = {"exit": exc.exit_status, "error": str(exc)}
                continue
            logs[run] = (attempt, log)

        def say_group(line: str) -> None:
            print(f"[fused {order.pack}] {line}", flush=True)

        try:
            results_of = run_fused(order, logs, start_time, say_group)
        except BaseException as exc:  # the whole group failed: every member's try says why
            for run in logs:
                says[run](f"ERROR: the fused group failed: {type(exc).__name__}: {exc}")
            raise
        for run, (attempt, _) in logs.items():
            result = results_of[run]
            if "error" in result:
                tried[run].error = result["error"]
                outcome[run] = {"exit": 2, "error": result["error"]}
            else:
                tried[run].result = result
                outcome[run] = {"exit": 0, "done": result["done"], "epoch": result["epoch"],
                                "attempt": attempt}
    atomic_write_text(Path(order.status), json.dumps(outcome, indent=1) + "\n")
    return 0 if all(entry["exit"] == 0 for entry in outcome.values()) else 1
