"""How many GPUs this process may use (``visible_gpus``: nvidia-smi, no torch), and GPU
utilisation and memory sampled during training, averaged per epoch.

One reading after an epoch says nothing about the epoch; a background thread reads NVML
(through torch, which maps CUDA_VISIBLE_DEVICES to the right device) every
``interval_s`` while the epoch trains. Needs ``nvidia-ml-py``; without NVML the sampler
says so once and the metrics stay empty."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from typing import Callable

Reading = tuple[float, float]  # (utilisation %, memory used MB)


def visible_gpus(environ=os.environ, run=subprocess.run, which=shutil.which) -> int | None:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES's entries where it is set (a Slurm
    step with GPUs sets it; CUDA ignores what follows an entry of -1), else the GPUs
    `nvidia-smi -L` lists; None where no NVIDIA tool says (nothing is known)."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        entries = [e.strip() for e in listed.split(",")]
        if "-1" in entries:
            entries = entries[:entries.index("-1")]
        return len([e for e in entries if e and e != "NoDevFiles"])
    smi = which("nvidia-smi")
    if not smi:
        return None
    out = run([smi, "-L"], capture_output=True, text=True)
    if out.returncode != 0:
        return 0  # the tool is there, but no driver or no device answers
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def nvml_reader(device) -> tuple[Callable[[], Reading] | None, str | None]:
    """A reader for ``device`` and None, or None and why it cannot be read."""
    import torch

    def read() -> Reading:
        return (float(torch.cuda.utilization(device)),
                torch.cuda.device_memory_used(device) / 2**20)

    try:
        read()
    except Exception as exc:  # no nvidia-ml-py, no NVML on this node
        return None, f"{type(exc).__name__}: {exc}"
    return read, None


class GpuSampler:
    def __init__(self, read: Callable[[], Reading], interval_s: float = 0.2):
        self.read, self.interval_s = read, interval_s
        self._samples: list[Reading] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        reading = self.read()
        with self._lock:
            self._samples.append(reading)

    def start(self) -> "GpuSampler":
        def loop():
            while not self._stop.wait(self.interval_s):
                try:
                    self.sample()
                except Exception:  # a failed read loses one sample, never the run
                    pass

        self._thread = threading.Thread(target=loop, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def take(self) -> dict:
        """Mean utilisation and peak memory of the samples since the last take, the last of
        them read now. The thread reads every ``interval_s`` from its start, not from the
        epoch's: an epoch shorter than that (0.15-0.2 s for the seed's lenet with mps at
        280,000-360,000 img/s) held no reading, or one by chance (mps with 4 replicas
        recorded none, with 8 some). The reading at the window's end is always there, and
        NVML's utilisation covers its last 1/6 to 1 s: the epoch's end."""
        try:
            self.sample()
        except Exception:  # as in the thread: a failed read loses one sample
            pass
        with self._lock:
            samples, self._samples = self._samples, []
        if not samples:
            return {"gpu_util_pct": None, "gpu_mem_mb": None, "gpu_samples": 0}
        return {"gpu_util_pct": sum(u for u, _ in samples) / len(samples),
                "gpu_mem_mb": max(m for _, m in samples), "gpu_samples": len(samples)}

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
