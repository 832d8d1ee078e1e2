"""Run a command under a private NVIDIA MPS control daemon, stopped even on failure."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..engine.gpu_monitor import visible_gpus


def mps_gpus(members: int, per_gpu: int) -> int:
    """GPUs of an MPS-shared pack: one per ``per_gpu`` members."""
    return -(-members // per_gpu)


def mps_dirs(environ=os.environ) -> dict:
    """Pipe and log directories inside the job's own tmp dir, never a shared /tmp path."""
    base = (environ.get("SLURM_TMPDIR") or environ.get("CIFARFLOW_SLURM_TMPDIR")  # past the jobstep
            or environ.get("TMPDIR") or tempfile.gettempdir())
    tag = environ.get("SLURM_JOB_ID") or str(os.getpid())
    return {"CUDA_MPS_PIPE_DIRECTORY": str(Path(base) / f"nvidia-mps-{tag}" / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(Path(base) / f"nvidia-mps-{tag}" / "log")}


def gpu_problem() -> str | None:
    if not shutil.which("nvidia-cuda-mps-control"):
        return "nvidia-cuda-mps-control not found (no NVIDIA driver on this node)"
    if not visible_gpus():
        return "nvidia-smi sees no GPU"
    return None


@contextlib.contextmanager
def private_daemon(dirs: dict):
    """A private MPS control daemon (its pipe and log directories ``dirs``) while the block
    runs, stopped even on failure; the block's CUDA processes need ``dirs`` in their
    environment."""
    env = {**os.environ, **dirs}
    for d in dirs.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    try:
        yield env
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env)
        print("[mps] daemon stopped", flush=True)


def run_with_mps(command: list[str], replicas: int, dry_run: bool = False) -> int:
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("mps-run: no command given", file=sys.stderr)
        return 2
    dirs = mps_dirs()
    print(f"[mps] {replicas} replicas on one GPU; " +
          " ".join(f"{k}={v}" for k, v in dirs.items()), flush=True)
    print("[mps] start: nvidia-cuda-mps-control -d", flush=True)
    print(f"[mps] run:   {' '.join(command)}", flush=True)
    print("[mps] stop:  echo quit | nvidia-cuda-mps-control", flush=True)
    if dry_run:
        return 0
    problem = gpu_problem()
    if problem:
        print(f"mps: needs an NVIDIA GPU with MPS, but {problem}; run it on a GPU node "
              "(profiles/slurm requests one) or use the cpu/ddp strategies", file=sys.stderr)
        return 2
    with private_daemon(dirs) as env:
        return subprocess.run(command, env=env).returncode
