"""For benchmarks: processes that train side by side (bench/gpu_sweep.py's MPS replicas)
start their first batch together, once each has its CUDA context, model and data.

``CIFARFLOW_START_BARRIER=<folder>:<count>``: each process writes its pid into the folder
and waits until ``count`` have, WAIT_S at most (then it says so and goes on). Unset, it
costs one dictionary lookup."""

from __future__ import annotations

import os
import time
from pathlib import Path

START_BARRIER = "CIFARFLOW_START_BARRIER"
WAIT_S = 60.0


def wait(log, environ=os.environ) -> float | None:
    """Seconds waited at the barrier, or None when there is none."""
    wanted = environ.get(START_BARRIER)
    if not wanted:
        return None
    folder, _, count = wanted.rpartition(":")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(os.getpid())).write_text("")
    t0 = time.monotonic()
    while len(list(folder.iterdir())) < int(count):
        if time.monotonic() - t0 > WAIT_S:
            log(f"start barrier: {len(list(folder.iterdir()))} of {count} processes after "
                f"{WAIT_S:g} s; going on alone")
            break
        time.sleep(0.01)
    return time.monotonic() - t0
