"""Touch only the jobs you submitted (issue 53): while a sweep runs through profiles/slurm,
the same command typed again in its folder (refused by the lock) and the data step run with
another config in the same checkout cancel none of its jobs, and the sweep ends with every
row; a `cifarflow controller-job` rerun after its controller job was cancelled replaces the
stale lock and takes the sweep over instead of cancelling it."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (ENV, FINISHED, PY, ROOT, SLURM_RUNS, self_stopped, slurm_job_prefix,
                      slurm_jobs, start_snakemake, stop_at, summary_rows, sweep_config)
from test_slurm import FAST_POLLING, profile_args, slurm

pytestmark = pytest.mark.slurm


def sacct_states(prefix: str) -> dict[str, str]:
    """job id -> state of every job named <prefix>_..., ended ones too (accounting)."""
    out = subprocess.run(["sacct", "-X", "-P", "-n", "--name", "", "-S", "now-1hour",
                          "-o", "JobID,JobName,State"], capture_output=True, text=True).stdout
    return {job: state.split()[0] for job, name, state in
            (line.split("|") for line in out.splitlines() if line.count("|") == 2)
            if name.startswith(prefix + "_")}


def test_a_second_command_and_another_configs_data_step_leave_the_sweep_alone(tmp_path):
    config = sweep_config(tmp_path / "sweep.yaml", runs=2, runs_per_job=1)
    marker = tmp_path / "stopped.pid"
    # the first segment to train stops itself before its first batch: the sweep runs on
    # (that job stays RUNNING) whatever this machine's speed
    proc = start_snakemake(tmp_path, *profile_args(tmp_path), configfile=[config],
                           env=stop_at("before-first-batch", "segment-1", marker))
    SLURM_RUNS.append(proc)
    frozen = self_stopped(marker, proc)
    prefix = slurm_job_prefix(tmp_path)
    queued = {j for j, (state, _) in slurm_jobs(prefix).items() if state not in FINISHED}
    assert queued, "the sweep has no job in the queue"

    again = slurm(tmp_path, configfile=config, check=False)
    said = again.stdout + again.stderr
    assert again.returncode != 0 and "LockException" in said, said[-3000:]
    assert "cancelled" not in said and "scancel" not in said, said[-3000:]

    other = tmp_path / "other.yaml"  # the documented data step, another results folder
    other.write_text("results: other-results\n")
    data = slurm(tmp_path, "extract_dataset", configfile=[config, other])
    assert "cancelled" not in data.stdout + data.stderr
    assert (tmp_path / "other-results/data").is_dir()

    states = slurm_jobs(prefix)
    assert all(states[j][0] != "CANCELLED" for j in queued if j in states), states
    os.kill(frozen, signal.SIGCONT)
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, out[-4000:]
    rows = summary_rows(tmp_path)
    assert len(rows) == 2 and {r["status"] for r in rows.values()} == {"ok"}, rows
    assert "CANCELLED" not in sacct_states(prefix).values()


def wait_for(what, timeout=600, step=0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = what()
        if found:
            return found
        time.sleep(step)
    raise AssertionError(f"waited {timeout} s in vain for {what}")


def controller_job(tmp_path, config, prefix, *extra):
    return subprocess.run(
        [str(Path(PY).parent / "cifarflow"), "controller-job", "--time", "30", *extra, "--",
         "-s", str(ROOT / "Snakefile"), "--configfile", str(config), *FAST_POLLING,
         "--slurm-jobname-prefix", prefix],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=900)


def test_a_controller_job_rerun_after_scancel_takes_the_sweep_over(tmp_path):
    """The controller job is cancelled while its training jobs are queued (one frozen in
    training): Snakemake dies with it and leaves its lock. The rerun names the controller
    gone, replaces the lock, runs the sweep to its end; nothing was cancelled at an exit."""
    prefix = slurm_job_prefix(tmp_path)
    config = sweep_config(tmp_path / "sweep.yaml", runs=2, runs_per_job=1)
    marker = tmp_path / "stopped.pid"
    env = stop_at("before-first-batch", "segment-1", marker)
    first = subprocess.run(
        [str(Path(PY).parent / "cifarflow"), "controller-job", "--time", "30", "--no-follow",
         "--", "-s", str(ROOT / "Snakefile"), "--configfile", str(config), *FAST_POLLING,
         "--slurm-jobname-prefix", prefix],
        cwd=tmp_path, env={**ENV, **env}, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    controller = re.search(r"Slurm job (\d+) runs the workflow", first.stdout).group(1)
    frozen = self_stopped(marker)
    subprocess.run(["scancel", controller], check=True)
    wait_for(lambda: subprocess.run(["squeue", "-h", "-j", controller], capture_output=True,
                                    text=True).stdout.strip() == "")
    locks = list((tmp_path / ".snakemake/locks").glob("*.lock"))
    assert locks, "the cancelled controller left no lock"
    os.kill(frozen, signal.SIGCONT)  # its job lives on: the rerun's try takes it over
    out = controller_job(tmp_path, config, prefix)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert re.search(rf"the controller [\d.]+ \(Slurm job {controller}\) is gone and left its "
                     r"lock: replaced", text), text[-4000:]
    assert not re.search(r"the workflow ended with \d+ job\(s\) of its own", text), text[-4000:]
    rows = summary_rows(tmp_path)
    assert len(rows) == 2 and {r["status"] for r in rows.values()} == {"ok"}, rows
