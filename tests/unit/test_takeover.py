"""Never two tries training one run: an earlier run of the workflow's live try is
cancelled and waited for; a try of an earlier run finding a newer one's does not train."""

import pytest

from cifarflow import tries
from cifarflow.takeover import Superseded, open_tries, take_over


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


def test_a_live_try_of_an_earlier_run_is_cancelled_and_waited_for(tmp_path, monkeypatch):
    start(tmp_path, monkeypatch, "1000.1", "11", segment=1, end="completed")
    start(tmp_path, monkeypatch, "1000.1", "12", segment=2)            # its controller died
    assert [e["job_id"] for e in open_tries(tries.read(tmp_path))] == ["12"]
    monkeypatch.setenv(tries.INVOCATION, "2000.7")                     # the rerun, in job 20
    monkeypatch.setenv("SLURM_JOB_ID", "20")
    polls, cancelled, said = iter([True, True, True, False]), [], []
    take_over(tmp_path, "cpu", say=said.append, is_alive=lambda e: next(polls),
              stop=lambda e: cancelled.append(e["job_id"]), poll_s=0)
    assert cancelled == ["12"]
    assert said[0] == ("[takeover] cpu: Slurm job 12 (segment 2, attempt 1, of an earlier run "
                       "of the workflow) still trains it: cancelling it, then resuming from "
                       "its checkpoint")
    assert said[1].startswith("[takeover] cpu: Slurm job 12 ended after")


def test_dead_tries_and_the_runs_own_are_left_alone(tmp_path, monkeypatch):
    start(tmp_path, monkeypatch, "1000.1", "12")                       # died with its controller
    start(tmp_path, monkeypatch, "2000.7", "20")                       # this run, requeued
    asked = []
    take_over(tmp_path, "cpu", is_alive=lambda e: asked.append(e["job_id"]) or False,
              stop=lambda e: pytest.fail("nothing to cancel"))
    assert asked == ["12"]


def test_a_try_of_an_earlier_run_never_trains_after_a_newer_one_started(tmp_path, monkeypatch):
    start(tmp_path, monkeypatch, "3000.9", "30", end="completed")     # the rerun's segment
    monkeypatch.setenv(tries.INVOCATION, "2000.7")                     # a job the dead one queued
    monkeypatch.setenv("SLURM_JOB_ID", "21")
    with pytest.raises(Superseded, match="cpu is trained by a newer run of the workflow "
                                         r"\(Slurm job 30, segment 1\)"):
        take_over(tmp_path, "cpu", is_alive=lambda e: False, stop=lambda e: None)


def test_a_try_that_will_not_end_is_not_trained_beside(tmp_path, monkeypatch):
    start(tmp_path, monkeypatch, "1000.1", "12")
    monkeypatch.setenv(tries.INVOCATION, "2000.7")
    monkeypatch.setenv("SLURM_JOB_ID", "20")
    with pytest.raises(Superseded, match="did not end within 0 s of its cancel"):
        take_over(tmp_path, "cpu", say=lambda m: None, is_alive=lambda e: True,
                  stop=lambda e: None, wait_s=0, poll_s=0)
