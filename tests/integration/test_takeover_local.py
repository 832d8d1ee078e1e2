"""The takeover outside Slurm, with real processes: an earlier run of the workflow's
`cifarflow train` still trains the segment (here frozen, as a suspended process is); the
rerun's try of that segment cancels it (SIGTERM, and SIGCONT so a stopped process acts on
it), waits for its end, and resumes exactly where it stopped."""

import os
import re
import subprocess
import time
from pathlib import Path

from conftest import ENV, PY, assert_bit_identical, spec, state_of, train, train_until_saved

from cifarflow.job import tries


def test_a_live_local_try_of_an_earlier_run_is_cancelled_and_resumed_from(tmp_path, cifar_dir):
    run_spec = spec(checkpoint_interval_s=0.001)  # a save after every batch
    run_dir = tmp_path / "runs/cpu"
    args = [PY, "-m", "cifarflow", "train", "--spec", run_spec, "--data", cifar_dir,
            "--out", run_dir / "segment-1", "--work", run_dir / "work", "--threads", 1]
    args = list(map(str, args))
    old = subprocess.Popen(args, env={**ENV, tries.INVOCATION: f"{time.time() - 60:.0f}.1"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    saved = train_until_saved([old.pid], run_dir / "work")  # frozen after its first save
    new = subprocess.run(args, env={**ENV, tries.INVOCATION: f"{time.time():.0f}.2"},
                         capture_output=True, text=True, timeout=600)
    old_out = old.communicate(timeout=60)[0]
    assert new.returncode == 0, new.stdout[-3000:] + new.stderr[-3000:]
    assert f"process {old.pid} on" in new.stdout  # the one line saying what it cancelled
    stopped = re.search(r"stopping at epoch (\d+) batch (\d+): signal SIGTERM", old_out)
    assert stopped, old_out[-3000:]
    epoch, batch = int(stopped[1]), int(stopped[2])
    assert (epoch - 1, batch) >= (saved["epoch"], saved["step"])
    assert f"at epoch {epoch}, batch {batch}" in new.stdout  # resumed where it stopped
    ends = [e for e in tries.read(run_dir) if e["event"] == "end"]
    assert [e["pid"] for e in ends] == [old.pid, new_pid(run_dir)]
    train(cifar_dir, tmp_path / "whole", threads=1)
    assert_bit_identical(state_of(run_dir / "segment-1")["model"],
                         state_of(tmp_path / "whole")["model"])


def new_pid(run_dir: Path) -> int:
    starts = [e for e in tries.read(run_dir) if e["event"] == "start"]
    return starts[-1]["pid"]
