"""A controller touches only the jobs it submitted: it records them once it holds the lock,
cancels at its end only those Slurm still lists (one scancel, one line), and nothing at all
where it never held the lock. A lock left by a controller that is gone is replaced; one held
by a live controller, or one nothing here can see, is named and left."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cifarflow import slurm
from cifarflow.controller.ownership import Ownership, controller_alive
from cifarflow.slurm_queue import JobRecord


def scancel_log(cancelled):
    def cancel(*jobs):
        cancelled.append(jobs)
        return slurm.Reply(("scancel", *jobs), "ok")
    return cancel


def owner(tmp_path, said, cancelled, queue, invocation="2000.1", environ=None):
    """An Ownership whose squeue lists ``queue`` (job -> state) of whatever it is asked."""
    def queued(owned):
        return [{"job": j, "state": s} for j, s in queue.items() if j in owned]
    return Ownership(str(tmp_path), invocation, str(tmp_path), environ or {},
                     say_at_end=said.append, cancel=scancel_log(cancelled), queued=queued)


def test_a_controller_that_never_held_the_lock_cancels_nothing(tmp_path):
    """A second `snakemake` in the folder of a running sweep: refused by the lock, it
    submitted nothing; the running sweep's jobs (recorded by their own controller) stay."""
    said, cancelled = [], []
    running = owner(tmp_path, said, cancelled, {"7": "RUNNING"}, invocation="1000.1")
    running.lock_taken([str(tmp_path / ".snakemake/locks/0.input.lock")])
    running.job_submitted("7", "train_cpu")
    second = owner(tmp_path, said, cancelled, {"7": "RUNNING"})
    assert second.at_exit() == [] and said == [] and cancelled == []
    entries = JobRecord(str(tmp_path)).entries()
    assert [e["event"] for e in entries] == ["controller", "job"]  # the second wrote nothing


def test_at_its_end_a_controller_cancels_its_own_queued_jobs_in_one_scancel(tmp_path):
    said, cancelled = [], []
    mine = owner(tmp_path, said, cancelled,
                 {"41": "PENDING", "42": "RUNNING", "43": "PENDING", "44": "COMPLETED"})
    mine.lock_taken([])
    for job in ("41", "42", "44"):
        mine.job_submitted(job, f"train_cpu_wildcards_cpu_{job}")
    # 43: the same user's, same folder, not submitted by this controller
    assert mine.at_exit() == ["41", "42", "44"]  # the queue function leaves out ended ones
    assert cancelled == [("41", "42", "44")]
    assert said == ["the workflow ended with 3 job(s) of its own still in Slurm's queue, which "
                    "nothing waits for: cancelled 41 (train_cpu_wildcards_cpu_41, PENDING), 42 "
                    "(train_cpu_wildcards_cpu_42, RUNNING), 44 (train_cpu_wildcards_cpu_44, "
                    "COMPLETED)"]
    record = JobRecord(str(tmp_path))
    assert record.entries()[-1]["event"] == "end" and record.open_controllers() == []
    assert set(record.jobs({"2000.1"})) == {"41", "42", "44"}


def test_nothing_left_nothing_said_and_a_failed_scancel_says_how(tmp_path):
    said, cancelled = [], []
    done = owner(tmp_path, said, cancelled, {})
    done.lock_taken([])
    done.job_submitted("5", "r")
    assert done.at_exit() == [] and said == [] and cancelled == []
    failing = Ownership(str(tmp_path), "3000.1", str(tmp_path), {}, say_at_end=said.append,
                        cancel=lambda *jobs: slurm.Reply(("scancel",), "timeout",
                                                         detail="no answer"),
                        queued=lambda owned: [{"job": "7", "state": "PENDING"}])
    failing.lock_taken([])
    failing.job_submitted("7", "r")
    failing.at_exit()
    assert said[-1].startswith("WARNING: ") and said[-1].endswith("(no answer): scancel 7")
    silent = Ownership(str(tmp_path), "4000.1", str(tmp_path), {}, say_at_end=said.append,
                       cancel=lambda *jobs: pytest.fail("nothing known"),
                       queued=lambda owned: None)
    silent.lock_taken([])
    silent.job_submitted("8", "r")
    assert silent.at_exit() == [] and "squeue did not answer" in said[-1]


def test_the_controller_entry_names_its_slurm_job_host_pid_and_locks(tmp_path):
    mine = owner(tmp_path, [], [], {}, environ={"SLURM_JOB_ID": "99"})
    mine.lock_taken(["rel/0.output.lock"])
    [entry] = JobRecord(str(tmp_path)).open_controllers()
    assert entry["slurm_job"] == "99" and entry["pid"] == os.getpid()
    assert entry["locks"] == [os.path.abspath("rel/0.output.lock")]


def left_lock(tmp_path, invocation, **where):
    lock = tmp_path / ".snakemake/locks" / f"{invocation}.output.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("results/summary.csv\n")
    JobRecord(str(tmp_path)).add("controller", invocation, locks=[str(lock)], **where)
    return lock


def test_a_lock_left_by_a_controller_that_is_gone_is_replaced_and_its_jobs_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is gone
    gone_here = left_lock(tmp_path, "1000.1", host="h", pid=dead.pid, slurm_job=None)
    gone_job = left_lock(tmp_path, "1000.2", host="n1", pid=5, slurm_job="41")
    JobRecord(str(tmp_path)).add("job", "1000.2", job="42", rule="train_cpu")
    said, cancelled = [], []
    mine = owner(tmp_path, said, cancelled, {"42": "RUNNING"})
    alive = lambda e: controller_alive(e, host="h", job_alive={"41": False}.get)
    assert mine.replace_stale_lock(said.append, replace=False, alive=alive) == []
    assert gone_here.exists() and said[-1].endswith("a run (not -n) replaces it")
    said.clear()
    assert mine.replace_stale_lock(said.append, alive=alive) == [str(gone_here), str(gone_job)]
    assert not gone_here.exists() and not gone_job.exists()
    assert said == [f"the controller 1000.1 (process {dead.pid} on h) is gone and left its "
                    "lock: replaced; its jobs still queued are taken over by this run's tries, "
                    "not cancelled",
                    "the controller 1000.2 (Slurm job 41) is gone and left its lock: replaced; "
                    "its jobs still queued are taken over by this run's tries, not cancelled"]
    assert cancelled == [] and JobRecord(str(tmp_path)).open_controllers() == []


def started(argv) -> subprocess.Popen:
    """A process, once /proc shows its command line (Popen may return before its exec)."""
    proc = subprocess.Popen(argv)
    while argv[-1].encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
        time.sleep(0.001)
    return proc


def test_a_lock_of_a_live_or_unseen_controller_is_left_and_named(tmp_path):
    live = started([sys.executable, "-c", "import time; time.sleep(60)", "snakemake"])
    try:
        here = left_lock(tmp_path, "1000.1", host="h", pid=live.pid, slurm_job=None)
        there = left_lock(tmp_path, "1000.2", host="login2", pid=live.pid, slurm_job=None)
        queued = left_lock(tmp_path, "1000.3", host="n1", pid=7, slurm_job="41")
        said = []
        mine = owner(tmp_path, said, [], {})
        alive = lambda e: controller_alive(e, host="h", job_alive={"41": True}.get)
        assert mine.replace_stale_lock(said.append, alive=alive) == []
        assert here.exists() and there.exists() and queued.exists()
        assert said == [
            f"the working directory is locked by the controller 1000.1 (process {live.pid} on "
            "h), which still runs: wait for it, or stop it first",
            f"the working directory is locked by the controller 1000.2 (process {live.pid} on "
            "login2), which cannot be seen from here: if it is gone, `snakemake --unlock` (its "
            "jobs are taken over, not cancelled)",
            "the working directory is locked by the controller 1000.3 (Slurm job 41), which "
            "still runs: wait for it, or stop it first"]
    finally:
        live.kill()
        live.wait()
    # a process that is no Snakemake (the pid was reused): the controller is gone
    other = started([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert controller_alive({"host": "h", "pid": other.pid}, host="h") is False
    finally:
        other.kill()
        other.wait()


def test_a_cut_line_of_a_killed_controller_is_skipped(tmp_path):
    record = JobRecord(str(tmp_path))
    record.add("job", "1.1", job="5", rule="r")
    with open(record.path, "a") as f:
        f.write('{"event": "job", "invoc')
    assert list(record.jobs()) == ["5"]


def test_a_fix_whose_target_is_gone_names_the_package_its_version_and_the_way_out():
    from importlib.metadata import version

    from cifarflow.controller.snakemake_fixes import patched

    class Executor:
        pass

    with pytest.raises(RuntimeError, match=rf"snakemake {version('snakemake')}: Executor"
                                           r"\.report_job_submission is not there\. Install"):
        patched(Executor, "report_job_submission", "snakemake")


def test_the_record_stays_where_it_was_opened_when_the_process_changes_folder(tmp_path,
                                                                            monkeypatch):
    """Snakemake returns to the folder it was started in before its exit hooks run."""
    monkeypatch.chdir(tmp_path)
    mine = owner("results", [], [], {})
    mine.lock_taken([])
    monkeypatch.chdir(tmp_path.parent)
    mine.at_exit()
    assert [e["event"] for e in JobRecord(str(tmp_path / "results")).entries()] == \
        ["controller", "end"]
