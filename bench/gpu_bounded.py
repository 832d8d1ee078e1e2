"""A command bounded in time, with everything it started, and the GPUs sampled while it
runs: bench/gpu_check.py's runner.

Each case runs in a process group (session) of its own. At its limit the whole group gets
SIGTERM, then SIGKILL after GRACE_S; once the case ends, whatever of its group is still
alive (a training process that outlived its launcher) is killed too, so no process of one
case uses the GPU during the next. An MPS daemon left by a cut-off `cifarflow mps-run`
(it daemonizes out of the group) is told to quit."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

GRACE_S = 5.0  # SIGTERM -> SIGKILL: a launcher's own clean-up (torchrun, mps-run)
KILL_WAIT_S = 5.0  # after SIGKILL: a process stuck in the driver may outlive it; go on
MPS_ANSWER_S = 10.0  # an MPS control daemon and its server answer within this, or not at all


class Budget:
    """Seconds left until a deadline; what a case may still have."""

    RESERVE_S = GRACE_S + 3  # to end a case at its limit and write the report after it

    def __init__(self, seconds: float, start: float | None = None):
        self.seconds = seconds
        self.deadline = (time.monotonic() if start is None else start) + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def limit(self, cap_s: float) -> float:
        """A case's time limit: its own cap, or what the budget has left, less the reserve."""
        return min(cap_s, self.left() - self.RESERVE_S)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from /proc."""
    pids = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:  # it ended while we looked
            continue
        fields = text[text.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.split("/")[2]))
    return pids


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # nothing of the group is left
        pass


def end_group(pgid: int, wait_s: float = GRACE_S) -> int:
    """SIGTERM to the group, SIGKILL to what is left after ``wait_s``; returns how many
    processes were still there at the start."""
    left = group_members(pgid)
    if not left:
        return 0
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(left)


def reap(proc: subprocess.Popen) -> int | None:
    """The killed leader's exit status, waited for KILL_WAIT_S at most (a process in
    uninterruptible sleep, in the driver, survives SIGKILL): None if it is still there."""
    try:
        return proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        return None


def quit_mps_daemons(roots: list[str]) -> list[str]:
    """`quit` to every private MPS daemon whose pipe directory is under ``roots`` (the check
    gives each case its own TMPDIR; a Slurm job's SLURM_TMPDIR is the job's own)."""
    quit_ = []
    for root in filter(None, roots):
        for pipe in glob.glob(os.path.join(root, "nvidia-mps-*", "pipe")):
            if not os.path.exists(os.path.join(pipe, "control")):
                continue
            env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe}
            try:
                subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env,
                               timeout=10, capture_output=True)
                quit_.append(pipe)
            except (OSError, subprocess.TimeoutExpired):
                pass
    return quit_


def mps_problem(timeout_s: float = MPS_ANSWER_S) -> str | None:
    """Why an MPS case cannot start here, found in seconds, or None: the control binary
    missing, or a private daemon (in a folder of its own) or its server not answering
    within ``timeout_s``. The probe's daemon is told to quit either way."""
    import tempfile

    if not shutil.which("nvidia-cuda-mps-control"):
        return "nvidia-cuda-mps-control not found (no NVIDIA MPS on this machine)"
    base = tempfile.mkdtemp(prefix="mps-probe-")
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": os.path.join(base, "pipe"),
           "CUDA_MPS_LOG_DIRECTORY": os.path.join(base, "log")}
    for d in ("pipe", "log"):
        os.makedirs(os.path.join(base, d))

    def ask(command: str | None, what: str) -> str | None:
        argv, given = (["nvidia-cuda-mps-control", "-d"], None) if command is None else \
            (["nvidia-cuda-mps-control"], f"{command}\n".encode())
        try:
            done = subprocess.run(argv, input=given, env=env, capture_output=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"the MPS {what} did not answer within {timeout_s:g} s"
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode(errors="replace").strip()[-200:]
            return f"the MPS {what} failed (rc {done.returncode}): {said or 'no output'}"
        return None

    try:
        return (ask(None, "control daemon (nvidia-cuda-mps-control -d)")
                or ask(f"start_server -uid {os.getuid()}", "server (start_server)")
                or ask("get_server_list", "server list (get_server_list)"))
    finally:
        try:
            subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env,
                           capture_output=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(base, ignore_errors=True)


def run_bounded(argv: list[str], log: Path, env: dict, limit_s: float, cwd: Path) -> dict:
    """``argv`` in a session of its own, its output in ``log``, ended with its whole group at
    ``limit_s``. Returns rc ("timeout" when cut off), wall_s, pgid and strays (processes of
    the group still alive after the case, killed)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=max(0.1, limit_s))
            strays = end_group(proc.pid, wait_s=1.0)
        except subprocess.TimeoutExpired:
            rc = "timeout"
            strays = end_group(proc.pid)
        if reap(proc) is None:  # bounded: the leader itself is stuck past SIGKILL
            rc = "stuck"
        stuck = group_members(proc.pid)
    daemons = quit_mps_daemons([env.get("TMPDIR", ""), env.get("SLURM_TMPDIR", "")])
    row = {"rc": rc, "wall_s": round(time.monotonic() - t0, 1), "pgid": proc.pid}
    if strays and rc != "timeout":
        row["strays_killed"] = strays
    if stuck:  # the check goes on; the report says what the next cases may share the GPU with
        row["stuck_after_kill"] = stuck
    if daemons:
        row["mps_daemons_stopped"] = daemons
    return row


class GpuUse(threading.Thread):
    """nvidia-smi's utilisation of every GPU every 200 ms while a case runs."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples: list[list[float]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
             "--format=csv,noheader,nounits", "-lms", "200"], stdout=subprocess.PIPE, text=True)
        self.start()

    def run(self):
        for line in self.proc.stdout:
            try:
                self.samples.append([float(v) for v in line.split(",")])
            except ValueError:  # "[N/A]" on some devices
                pass

    def stop(self, gpus: int) -> dict:
        """Mean utilisation over the case (averaged over its ``gpus``), peak memory."""
        self.proc.terminate()
        self.join(timeout=5)
        gpus = max(1, gpus)
        rows = [self.samples[i:i + gpus] for i in range(0, len(self.samples) - gpus + 1, gpus)]
        busy = [sum(r[0] for r in row) / len(row) for row in rows]
        return {"gpu_util_mean_pct": sum(busy) / len(busy) if busy else None,
                "gpu_mem_max_mb": max((r[1] for r in self.samples), default=None)}


def gpu_use() -> GpuUse | None:
    """A sampler started now, or None without nvidia-smi."""
    return GpuUse() if shutil.which("nvidia-smi") else None
