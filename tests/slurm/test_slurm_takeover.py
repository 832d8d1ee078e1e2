"""The controller dies, the jobs live on: the rerun never lets two jobs train one run."""

import re

import pytest

from conftest import assert_bit_identical, cli, snakemake, state_of
from cifarflow import checkpoint as ckpt
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
    frozen = ckpt.read_manifest(tmp_path / "results/runs/cpu/work")  # its last save
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
    # the cancelled job checkpointed at its next batch (SIGTERM): past the save it was
    # frozen after; the new try resumed at exactly that batch
    runs = ckpt.read_manifest(tmp_path / "results/runs/cpu/segment-1")["segment_runs"]
    [stop] = [r for r in runs if r["slurm_job_id"] == old]
    assert stop["stopped"] == "signal SIGTERM", stop
    assert (stop["epoch"], stop["step"]) > (frozen["epoch"], frozen["step"]), (stop, frozen)
    assert (f"resumed from results/runs/cpu/work at epoch {stop['epoch'] + 1}, batch "
            f"{stop['step']}\n") in log, log[-3000:]
    cli("train", "--spec", tmp_path / "results/runs/cpu/spec.json", "--data",
        tmp_path / "results/data/cifar-10-batches-py", "--out", tmp_path / "reference",
        "--threads", 1, timeout=900)
    assert_bit_identical(state_of(tmp_path / "results/runs/cpu/segment-1")["model"],
                         state_of(tmp_path / "reference")["model"])
