"""The controller dies, the jobs live on: the rerun never lets two jobs train one run, cancels
what the dead one left pending, and asks the controller about a job it waits for only a few
times a minute."""

import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import assert_bit_identical, cli, run_batches, slurm_job_prefix, snakemake, state_of
from cifarflow.engine.checkpoints import files as ckpt
from cifarflow.job import takeover
from cifarflow.job import tries
from cifarflow.slurm_queue import QUEUE_FORMAT, JobRecord
from alliance import CPU_ACCOUNT
from test_slurm import CONFIG, job_state, slurm, start_long_segment, submitted

pytestmark = pytest.mark.slurm


def test_a_rerun_after_the_controller_died_takes_over_the_live_job(tmp_path):
    """The login session is lost (Snakemake killed with SIGKILL) while a segment trains;
    its Slurm job lives on (frozen here, so it still trains however fast this machine is).
    The rerun (--unlock, then the same command) cancels that job before its own try
    trains, waits for its end, resumes from its checkpoint, and ends with the weights of
    an uninterrupted run."""
    proc, old = start_long_segment(tmp_path, epochs=4, frozen=True)  # at a known save
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
        run_batches(tmp_path, "cpu"), "--out", tmp_path / "reference",
        "--threads", 1, timeout=900)
    assert_bit_identical(state_of(tmp_path / "results/runs/cpu/segment-1")["model"],
                         state_of(tmp_path / "reference")["model"])


def sbatch(workdir, *args) -> str:
    """A job named after the test's folder (the cleanup fixture cancels what is left)."""
    return subprocess.run(["sbatch", "--parsable", "-A", CPU_ACCOUNT, "--mem", "50", "-o",
                           "/dev/null", "-J", f"{slurm_job_prefix(workdir)}_probe", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def held_job(workdir, invocation: str | None = None) -> str:
    """A pending job in `workdir`, as Snakemake's plugin submits one (its comment names the
    rule); held, so it uses no CPU. ``invocation``: recorded as that run of the workflow's
    (its controller's JobRecord, in workdir/results); None: submitted by someone else."""
    job = sbatch(workdir, "--hold", "-D", str(workdir), "--comment", "rule_train_cpu_wildcards_cpu_1",
                 "--wrap", "true")
    if invocation:
        JobRecord(str(workdir / "results")).add("job", invocation, job=job,
                                                rule="train_cpu_wildcards_cpu_1")
    return job


def restarted(tmp_path, monkeypatch, earlier_job: str) -> str:
    """The run's tries.jsonl holds a try of an earlier run of the workflow (in
    `earlier_job`), and this process is a try of the run of the workflow started now (in
    the working directory tmp_path): returns its invocation."""
    run_dir = tmp_path / "results/runs/cpu"
    monkeypatch.setenv(tries.INVOCATION, "1000.1")
    monkeypatch.setenv("SLURM_JOB_ID", earlier_job)
    tries.record(run_dir, 1, 1, "start")
    mine = f"{time.time():.0f}.{os.getpid()}"
    monkeypatch.setenv(tries.INVOCATION, mine)
    monkeypatch.setattr(takeover, "PENDING_ASKED", set())
    monkeypatch.chdir(tmp_path)  # a job's working directory is the workflow's
    return mine


def test_a_restart_cancels_what_the_earlier_run_of_the_workflow_left_pending(tmp_path,
                                                                              monkeypatch):
    """Pending jobs an earlier run of the workflow recorded submitting are cancelled when
    the first try of this one takes over; its own stay, and so does a job of the same
    folder and rule comment that no controller recorded (a second Snakemake's, refused by
    the lock, or the user's own)."""
    earlier = held_job(tmp_path, "1000.1")
    stranger = held_job(tmp_path)
    time.sleep(2)  # squeue gives submit times in whole seconds
    ended = sbatch(tmp_path, "--wrap", "true")
    deadline = time.time() + 300  # the earlier try's job ended: nothing to wait for
    while job_state(ended) != "COMPLETED" and time.time() < deadline:
        time.sleep(0.5)
    restarted(tmp_path, monkeypatch, ended)
    time.sleep(2)
    own = held_job(tmp_path, os.environ[tries.INVOCATION])
    monkeypatch.setenv("SLURM_JOB_ID", own)  # this try's job (the restarted workflow's)
    said = []
    try:
        takeover.take_over(tmp_path / "results/runs/cpu", "cpu", say=said.append)
        assert (job_state(earlier), job_state(own), job_state(stranger)) == \
            ("CANCELLED", "PENDING", "PENDING")
        assert said[0] == (f"[takeover] cancelled 1 pending Slurm job(s) an earlier run of the "
                           f"workflow queued: {earlier} (this run of the workflow queues its own)")
    finally:
        subprocess.run(["scancel", earlier, own, stranger])


@pytest.mark.slow  # a minute of looking at a job that will not end
def test_a_job_that_will_not_end_is_asked_about_a_handful_of_times_a_minute(tmp_path,
                                                                            monkeypatch):
    """The earlier run of the workflow's try is still alive a minute after the takeover
    (here: not cancelled at all, so on any machine): the take-over asks squeue about it 7
    times in that minute (with a look a second: 62), and once for pending jobs."""
    live = sbatch(tmp_path, "--wrap", "sleep 300")
    deadline = time.time() + 120  # a running try (a pending one would be cancelled as such)
    while job_state(live) != "RUNNING" and time.time() < deadline:
        time.sleep(0.2)
    JobRecord(str(tmp_path / "results")).add("job", "1000.1", job=live, rule="train_cpu")
    calls = tmp_path / "squeue.calls"
    wrappers = tmp_path / "bin"
    wrappers.mkdir()
    (wrappers / "squeue").write_text(f'#!/bin/sh\necho "squeue $*" >> {calls}\n'
                                     f'exec {shutil.which("squeue")} "$@"\n')
    (wrappers / "squeue").chmod(0o755)
    try:
        restarted(tmp_path, monkeypatch, live)
        monkeypatch.setenv("SLURM_JOB_ID", "1")  # this try's job: any other
        monkeypatch.setenv("PATH", f"{wrappers}:{os.environ['PATH']}")
        t0 = time.monotonic()
        with pytest.raises(takeover.Superseded, match=f"Slurm job {live} did not end within 60 s"):
            takeover.take_over(tmp_path / "results/runs/cpu", "cpu", say=lambda line: None,
                               reach=takeover.Reach(stop=lambda entry: None),
                               patience=takeover.Patience(wait_s=60))
        assert time.monotonic() - t0 > 60
        looks = calls.read_text().splitlines()
        assert looks == [f"squeue --me -h -r -o {QUEUE_FORMAT}"] + [f"squeue -h -j {live} -o %T"] * 7
    finally:
        subprocess.run(["scancel", live])
