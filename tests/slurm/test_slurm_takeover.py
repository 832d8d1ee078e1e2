"""The controller dies, the jobs live on: the rerun never lets two jobs train one run."""

import re

import pytest

from conftest import assert_bit_identical, cli, snakemake, state_of
from test_slurm import CONFIG, freeze_training, job_state, slurm, start_long_segment, submitted

pytestmark = pytest.mark.slurm


def test_a_rerun_after_the_controller_died_takes_over_the_live_job(tmp_path):
    """The login session is lost (Snakemake killed with SIGKILL) while a segment trains;
    its Slurm job lives on (frozen here, so it still trains however fast this machine is).
    The rerun (--unlock, then the same command) cancels that job before its own try
    trains, waits for its end, resumes from its checkpoint, and ends with the weights of
    an uninterrupted run."""
    proc, old = start_long_segment(tmp_path, epochs=4)
    freeze_training(old)
    proc.kill()
    proc.communicate(timeout=60)
    assert job_state(old) == "RUNNING"  # the job outlived its controller
    configs = [CONFIG, tmp_path / "long.yaml"]
    snakemake(tmp_path, "--unlock", configfile=configs)
    out = slurm(tmp_path, configfile=configs)
    text = out.stdout + out.stderr
    assert job_state(old) == "CANCELLED"
    [new] = set(submitted(text)["train_cpu"])
    assert new != old and job_state(new) == "COMPLETED"
    log = (tmp_path / "results/logs/train/cpu/segment-1.log").read_text()
    assert (f"[takeover] cpu: Slurm job {old} (segment 1, attempt 1, of an earlier run of the "
            "workflow) still trains it: cancelling it, then resuming from its checkpoint") in log
    assert re.search(rf"\[takeover\] cpu: Slurm job {old} ended after [\d.]+ s", log)
    # the cancelled job checkpointed at its next batch (SIGTERM), and the rerun went on there
    resumed = re.search(r"resumed from results/runs/cpu/work at epoch (\d+), batch (\d+)", log)
    assert resumed and (resumed[1], resumed[2]) != ("1", "0"), log[-3000:]
    cli("train", "--spec", tmp_path / "results/runs/cpu/spec.json", "--data",
        tmp_path / "results/data/cifar-10-batches-py", "--out", tmp_path / "reference",
        "--threads", 1, timeout=900)
    assert_bit_identical(state_of(tmp_path / "results/runs/cpu/segment-1")["model"],
                         state_of(tmp_path / "reference")["model"])
