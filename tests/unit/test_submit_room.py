"""A full queue is a wait, not a failure (issue 55): SubmitRoom's counting, and the fix
(submit_room.share_the_submit_limit) on the real plugin Executor class, its run_job
standing in for sbatch with the refusal Slurm 22.05 prints (the real sbatch against a real
MaxSubmitJobs: tests/slurm/test_slurm_hiccups.py)."""

import threading
from types import SimpleNamespace

import pytest

import snakemake_executor_plugin_slurm as plugin
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

from cifarflow.controller import snakemake_fixes as fixes
from cifarflow.controller.submit_room import SubmitRoom, share_the_submit_limit, waits_for

REFUSAL = ("SLURM sbatch failed. The error message was 'sbatch: error: AssocMaxSubmitJobLimit\n"
           "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
           "(job submit limit, user's size and/or time limits)'.")
OTHER = ("SLURM sbatch failed. The error message was 'sbatch: error: Batch job submission "
         "failed: Invalid account or account/partition combination specified'.")


CONTROLLER_DOWN = ("SLURM sbatch failed. The error message was 'sbatch: error: Batch job "
                   "submission failed: Unable to contact slurm controller (connect failure)'.")


def test_a_submit_limit_and_a_silent_controller_are_waits_any_other_refusal_is_not():
    assert waits_for(REFUSAL) == "room"
    assert waits_for("sbatch: error: QOSMaxSubmitJobPerUserLimit") == "room"
    assert waits_for(CONTROLLER_DOWN) == "controller"
    assert waits_for(OTHER) is None
    # a job pending for its running-jobs limit is queued: no refusal to wait for
    assert waits_for("sbatch: error: AssocMaxJobsLimit") is None


def room(counts, limit=6):
    said, slept = [], []
    counts = iter(counts)
    return SubmitRoom(said.append, lambda: limit, count=lambda: next(counts),
                      recount_s=10, sleep=slept.append), said, slept


def test_nothing_is_asked_while_no_sbatch_is_refused():
    r, said, slept = room([])  # a count would raise StopIteration
    for _ in range(50):
        r.wait()
    assert (said, slept) == ([], [])


def test_a_refusal_waits_until_the_users_jobs_are_fewer_than_the_limit_saying_so_once():
    r, said, slept = room([6, 6, 6, 5, 6, 5])
    r.refused(REFUSAL)  # 6 queued at the refusal
    r.wait()  # 6, 6, then 5: room
    assert slept == [10, 10, 10]
    assert said == ["waiting: 6 of your jobs queued, MaxSubmitJobs 6: each submission waits for "
                    "one of your jobs to leave the queue and is made again (not a failed try; "
                    "your other jobs are left alone)"]
    r.refused(REFUSAL)  # full again: waits again, silently
    r.refused(REFUSAL)  # another thread's refusal in the same spell: nothing said, no count
    r.wait()  # 6, then 5
    assert len(said) == 1 and slept == [10] * 5 and r.refusals == 3
    r.accepted()  # sbatch took one: the next submission goes at once
    r.wait()
    assert slept == [10] * 5


def test_a_refusal_counted_once_the_queue_emptied_does_not_wait_forever():
    """The hang it fixes: two submissions refused at once; by the time the second counted,
    this workflow's jobs had left the queue and only the user's two held jobs were in it, and
    it waited for fewer than 2 (the count at its refusal), forever. Against the limit, the
    held jobs leave room."""
    r, said, slept = room([4, 2], limit=4)
    r.refused(REFUSAL)  # 4 at the refusal: 2 held, 2 of this workflow's
    r.refused(REFUSAL)  # the other thread's; by now this workflow's jobs ended
    r.wait()
    assert slept == [10]


def test_a_count_that_never_falls_below_the_limit_lets_sbatch_decide_every_minute():
    """squeue --me counts the jobs of every account; the limit is per account: the count can
    stay at the limit while the account refused has room. sbatch is asked again after
    retry_s, whatever the count."""
    r, said, slept = room([9] * 10, limit=4)
    r.refused(REFUSAL)
    r.wait()
    assert slept == [10] * 6  # 60 s: retry_s


def test_a_silent_controller_is_asked_again_each_interval_without_counting():
    r, said, slept = room([])  # squeue is not asked: it needs slurmctld too
    r.refused(CONTROLLER_DOWN)
    r.wait()
    r.refused(CONTROLLER_DOWN)
    r.wait()
    assert slept == [10, 10] and len(said) == 1
    assert said[0].startswith("slurmctld does not answer sbatch (sbatch: error: Batch job "
                              "submission failed: Unable to contact slurm controller")


def test_without_a_known_limit_slurms_own_words_are_said_and_sbatch_decides():
    r, said, slept = room([3], limit=None)
    r.refused(REFUSAL)
    r.wait()  # nothing to count against: sbatch is asked again after retry_s
    assert said[0].startswith("waiting: 3 of your jobs queued, sbatch: error: Batch job "
                              "submission failed: Job violates accounting/QOS policy")
    assert slept == [10] * 6


def test_no_waiting_submission_holds_the_others():
    gate, counted = threading.Event(), []

    def count():
        counted.append(threading.current_thread().name)
        return 1 if gate.is_set() else 2

    r = SubmitRoom(lambda line: None, lambda: 2, count=count, recount_s=0.01)
    r.refused(REFUSAL)
    waiters = [threading.Thread(target=r.wait, name=f"submit-{i}") for i in range(4)]
    for t in waiters:
        t.start()
    gate.set()
    for t in waiters:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in waiters)
    assert {f"submit-{i}" for i in range(4)} <= set(counted)  # each counted for itself


@pytest.fixture
def executor(monkeypatch):
    """The real Executor class, its run_job a stand-in sbatch refused ``refusals`` times
    (the plugin's own path: _report_job_error_threadsafe, then return), then accepted."""
    for name in ("run_job", "_report_job_error_threadsafe"):
        monkeypatch.setattr(plugin.Executor, name, getattr(plugin.Executor, name))
    monkeypatch.setattr(fixes, "LISTENERS", {})
    tries = []

    def run_job(self, job):
        tries.append(job)
        if len(tries) <= self.refusals:
            self._report_job_error_threadsafe(SubmittedJobInfo(job), self.message)
        else:
            self.submitted.append(job)

    monkeypatch.setattr(plugin.Executor, "run_job", run_job)
    ex = object.__new__(plugin.Executor)
    ex._main_event_loop, ex.submitted, ex.errors, ex.tries = None, [], [], tries
    ex.report_job_error = lambda job_info, msg=None: ex.errors.append((job_info.job, msg))
    return ex


def test_a_job_refused_for_the_limit_is_submitted_again_not_failed(executor):
    said, counts = [], iter([4, 4, 3, 4, 3])
    share_the_submit_limit(SubmitRoom(said.append, lambda: 4, count=lambda: next(counts),
                                      sleep=lambda s: None))
    job = SimpleNamespace(name="train_cpu")
    executor.refusals, executor.message = 2, REFUSAL
    executor.run_job(job)
    assert executor.tries == [job] * 3 and executor.submitted == [job]
    assert executor.errors == [] and len(said) == 1


def test_any_other_refusal_is_the_jobs_failure_as_before(executor):
    share_the_submit_limit(SubmitRoom(lambda line: None, lambda: 4, count=lambda: 0))
    job = SimpleNamespace(name="train_cpu")
    executor.refusals, executor.message = 1, OTHER
    executor.run_job(job)
    assert executor.tries == [job] and executor.errors == [(job, OTHER)]


def test_what_the_fix_raises_is_the_jobs_error_not_a_job_never_submitted(executor):
    """The plugin runs run_job in a thread pool and drops what it raises: the job would be
    neither submitted nor failed, and the workflow would wait on it forever."""
    def count():
        raise OSError("squeue: no such file")

    share_the_submit_limit(SubmitRoom(lambda line: None, lambda: 4, count=count,
                                      sleep=lambda s: None))
    job = SimpleNamespace(name="train_cpu")
    executor.refusals, executor.message = 1, REFUSAL
    executor.run_job(job)
    assert executor.submitted == [] and len(executor.errors) == 1
    assert executor.errors[0][1] == ("cifarflow could not submit it: "
                                     "OSError('squeue: no such file')")
