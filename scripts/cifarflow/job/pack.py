"""One job, several sweep members: segment k of every member of a pack, at once.

Inside a Slurm allocation each member is a job step of its own (``srun --exact``: one task
of cpus_per_task cores, and one GPU where the strategy trains on one), so Slurm places the
members on the allocation's nodes and keeps them apart; outside Slurm they are child
processes, as many at once as the job's cores allow. Every member keeps its own log
(``segment-<k>.attempt<n>.log``; ``segment-<k>.log`` points at the latest), checkpoint,
metrics and exit status. The job fails if a member failed, once all others finished; its
retry trains only the members without a published segment k. The pack's record
(``results/packs/<pack>/segment-<k>.json``) is written last, when all members succeeded.

A fused pack (``pack.fuse``) trains its members in ONE process as one fused model
(engine/fused.py): one step of the allocation (cpus_per_task cores, one GPU) runs
``cifarflow train-fused``, which keeps each member's log, tries, checkpoint and exit status
as above and reports them in a status file.

An MPS-shared pack (``pack.per_gpu`` M) runs its members M at a time on each GPU under one
private MPS daemon (mps_daemon.py). A Slurm step's GPUs are its own, so in a Slurm job the
driver starts ONE step holding the node's GPUs and the members' cores (``srun --gres=gpu:G
cifarflow train-pack ... --in-step``); there, and outside Slurm, it starts the daemon and
the members as child processes, each pinned to its GPU (``CIFARFLOW_CUDA_DEVICE``), with its
own log, try, checkpoint and exit status as above.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..engine.checkpoint import CheckpointError, atomic_write_text, read_manifest
from ..config import TrainConfig
from ..engine.gpu_monitor import visible_gpus
from ..layout import RunPaths, attempt_logs_pattern, attempt_number, try_args
from .mps_daemon import gpu_problem, mps_dirs, mps_gpus, private_daemon
from ..engine.strategies.base import GPU_INDEX_ENV


def member_argv(paths: RunPaths, k: int, data: str, until_epoch: int, threads: int,
                budget_min: float, attempt: int, mem_mb: int, stage: str = "none") -> list[str]:
    """The member's `cifarflow train`, exactly as an unpacked segment job runs it."""
    return [sys.executable, "-m", "cifarflow", "train",
            *paths.train_args(k, data=data, until_epoch=until_epoch, stage=stage),
            *try_args(threads, budget_min, mem_mb, attempt)]


def fused_argv(pack: str, k: int, members: list[str], results: str, data: str, until_epoch: int,
               threads: int, budget_min: float, mem_mb: int, stage: str, mode: str,
               status: Path) -> list[str]:
    """The fused group's one process: `cifarflow train-fused`."""
    return [sys.executable, "-m", "cifarflow", "train-fused", "--pack", pack, "--segment", str(k),
            "--results", results, "--data", data, "--until-epoch", str(until_epoch),
            "--threads", str(threads), "--budget-min", str(budget_min), "--mem-mb", str(mem_mb),
            "--stage-data", stage, "--mode", mode, "--status", str(status),
            "--members", *members]


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
                        stage: str, mode: str, status: Path, start_time: float) -> int:
    """`cifarflow train-fused`: each member's log (its own try, as unpacked), its try in
    tries.jsonl, then the fused training; each member's outcome in ``status``."""
    from . import tries
    from ..engine.fused import train_fused
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
        results_of = train_fused(segments, None if mode == "auto" else mode, start_time, say)
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
