"""Never two tries training one run: an earlier run of the workflow's live try is
cancelled and waited for (looked at less and less often); a try of an earlier run finding
a newer one's does not train; the jobs an earlier run of the workflow left pending are
cancelled."""

import itertools
from datetime import datetime

import pytest

from cifarflow.job import takeover

from cifarflow.job import tries
from cifarflow.slurm_queue import QUEUE_FORMAT, JobRecord
from cifarflow.job.takeover import (Patience, Reach, Superseded, backoff, cancel_earlier_pending,
                                open_tries, take_over)


def start(run_dir, monkeypatch, invocation, job, segment=1, attempt=1, end=None):
    monkeypatch.setenv(tries.INVOCATION, invocation)
    monkeypatch.setenv("SLURM_JOB_ID", job)
    tries.record(run_dir, segment, attempt, "start")
    if end:
        tries.record(run_dir, segment, attempt, "end", ended=end)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "CIFARFLOW_SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(takeover, "PENDING_ASKED", set())  # each test a fresh process


def no_pending(mine, results, say):
    """The earlier run of the workflow left nothing pending (the cluster test cancels)."""


def test_a_live_try_of_an_earlier_run_is_cancelled_and_waited_for(tmp_path, monkeypatch):
    start(tmp_path, monkeypatch, "1000.1", "11", segment=1, end="completed")
    start(tmp_path, monkeypatch, "1000.1", "12", segment=2)            # its controller died
    assert [e["job_id"] for e in open_tries(tries.read(tmp_path))] == ["12"]
    monkeypatch.setenv(tries.INVOCATION, "2000.7")                     # the rerun, in job 20
    monkeypatch.setenv("SLURM_JOB_ID", "20")
    polls, cancelled, said = iter([True, True, True, False]), [], []
    take_over(tmp_path, "cpu", say=said.append,
              reach=Reach(is_alive=lambda e: next(polls),
                          stop=lambda e: cancelled.append(e["job_id"]),
                          cancel_pending=lambda mine, results, say: cancelled.append(f"pending of {mine}")),
              patience=Patience(poll_s=0))
    assert cancelled == ["pending of 2000.7", "12"]
    assert said[0] == ("[takeover] cpu: Slurm job 12 (segment 2, attempt 1, of an earlier run "
                       "of the workflow) still trains it: cancelling it, then resuming from "
                       "its checkpoint")
    assert said[1].startswith("[takeover] cpu: Slurm job 12 ended after")


def test_dead_tries_and_the_runs_own_are_left_alone(tmp_path, monkeypatch):
    start(tmp_path, monkeypatch, "1000.1", "12")                       # died with its controller
    start(tmp_path, monkeypatch, "2000.7", "20")                       # this run, requeued
    asked = []
    take_over(tmp_path, "cpu", reach=Reach(is_alive=lambda e: asked.append(e["job_id"]) or False,
                                           stop=lambda e: pytest.fail("nothing to cancel"),
                                           cancel_pending=no_pending))
    assert asked == ["12"]


def test_a_try_of_an_earlier_run_never_trains_after_a_newer_one_started(tmp_path, monkeypatch):
    start(tmp_path, monkeypatch, "3000.9", "30", end="completed")     # the rerun's segment
    monkeypatch.setenv(tries.INVOCATION, "2000.7")                     # a job the dead one queued
    monkeypatch.setenv("SLURM_JOB_ID", "21")
    with pytest.raises(Superseded, match="cpu is trained by a newer run of the workflow "
                                         r"\(Slurm job 30, segment 1\)"):
        take_over(tmp_path, "cpu", reach=Reach(
            is_alive=lambda e: False, stop=lambda e: None,
            cancel_pending=lambda mine, results, say: pytest.fail("a stale try cancels nothing")))


def test_a_try_that_will_not_end_is_not_trained_beside(tmp_path, monkeypatch):
    start(tmp_path, monkeypatch, "1000.1", "12")
    monkeypatch.setenv(tries.INVOCATION, "2000.7")
    monkeypatch.setenv("SLURM_JOB_ID", "20")
    with pytest.raises(Superseded, match="did not end within 0 s of its cancel"):
        take_over(tmp_path, "cpu", say=lambda m: None,
                  reach=Reach(is_alive=lambda e: True, stop=lambda e: None,
                              cancel_pending=no_pending),
                  patience=Patience(wait_s=0, poll_s=0))


def test_a_cancelled_job_is_looked_at_less_and_less_often(tmp_path, monkeypatch):
    """2 s, 4 s, 8 s, 16 s, then every 30 s: a job that outlives the whole 600 s is
    asked about 26 times, not 603 (a clock of its own: no machine's speed counts)."""
    assert list(itertools.islice(backoff(2, 30), 7)) == [2, 4, 8, 16, 30, 30, 30]
    start(tmp_path, monkeypatch, "1000.1", "12")
    monkeypatch.setenv(tries.INVOCATION, "2000.7")
    monkeypatch.setenv("SLURM_JOB_ID", "20")
    now, looks = [0.0], []
    with pytest.raises(Superseded, match="did not end within 600 s"):
        take_over(tmp_path, "cpu", say=lambda m: None,
                  reach=Reach(is_alive=lambda e: looks.append(now[0]) or True,
                              stop=lambda e: None, cancel_pending=no_pending),
                  patience=Patience(clock=lambda: now[0],
                                    sleep=lambda s: now.__setitem__(0, now[0] + s)))
    assert looks[:7] == [0, 0, 2, 6, 14, 30, 60] and looks[-1] == 630
    assert len(looks) == 26  # one before the cancel, 25 after (603 with a look a second)


def squeue_line(job, submitted, state="PENDING", comment="rule_train_cpu_wildcards_cpu_1"):
    stamp = datetime.fromtimestamp(submitted).isoformat(timespec="seconds")
    return f"{job}|{state}|Priority|{comment}|debug||{stamp}\n"


def test_an_earlier_run_of_the_workflows_pending_jobs_are_cancelled(tmp_path):
    """Pending, recorded by a controller of this results folder that started before this
    run of the workflow: cancelled, in one scancel. This run's own, a running one, and jobs
    no controller of this folder recorded (another folder's, a second Snakemake's that never
    held the lock, one submitted by hand, with the same rule comment) stay."""
    assert QUEUE_FORMAT.split("|")[-1] == "%V"  # the submit time, as these lines give it
    record = JobRecord(str(tmp_path))
    for invocation, job in (("1990.4", "31"), ("1999.5", "32"), ("1999.5", "36"),
                            ("2001.6", "33")):
        record.add("job", invocation, job=job, rule="train_cpu")
    queue = (squeue_line("31", 1990) + squeue_line("32", 1999)
             + squeue_line("33", 2001)                       # this run's own
             + squeue_line("36", 1999, state="RUNNING")      # a try: its run's takeover
             + squeue_line("34", 1990)                       # not recorded here
             + squeue_line("35", 1990, comment="(null)"))
    stopped, said = [], []
    got = cancel_earlier_pending("2000.7", tmp_path, said.append, query=lambda: queue,
                                 stop=lambda *jobs: stopped.append(jobs))
    assert got == ["31", "32"] and stopped == [("31", "32")]
    assert said == ["[takeover] cancelled 2 pending Slurm job(s) an earlier run of the workflow "
                    "queued: 31 32 (this run of the workflow queues its own)"]
    assert cancel_earlier_pending("1000.1", tmp_path, said.append, query=lambda: queue,
                                  stop=lambda *jobs: pytest.fail("none")) == []
    assert cancel_earlier_pending("2000.7", tmp_path / "other", said.append,
                                  query=lambda: pytest.fail("nothing recorded: no squeue"),
                                  stop=lambda *jobs: pytest.fail("none")) == []


def test_pending_jobs_are_looked_for_once_a_process_and_only_after_a_restart(tmp_path,
                                                                            monkeypatch):
    asked = []
    start(tmp_path, monkeypatch, "2000.7", "20")                       # only this run's tries
    take_over(tmp_path, "cpu",
              reach=Reach(cancel_pending=lambda mine, results, say: asked.append(mine)))
    assert asked == []
    start(tmp_path / "other", monkeypatch, "1000.1", "12", end="completed")
    monkeypatch.setenv(tries.INVOCATION, "2000.7")
    for _ in range(2):  # a fused pack: each member takes over, one look for the job
        take_over(tmp_path / "other", "cpu",
                  reach=Reach(cancel_pending=lambda mine, results, say: asked.append(mine)))
    assert asked == ["2000.7"]
    monkeypatch.setattr(takeover, "PENDING_ASKED", set())
    monkeypatch.delenv("SLURM_JOB_ID")                                  # not under Slurm
    take_over(tmp_path / "other", "cpu",
                  reach=Reach(cancel_pending=lambda mine, results, say: asked.append(mine)))
    assert asked == ["2000.7"]
