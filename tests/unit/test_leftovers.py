"""Nothing of the workflow's left in the queue when its main process ends: the jobs of its
working directory that Snakemake submitted and that squeue still lists are cancelled in one
scancel, each named; where scancel fails, the line says how to do it by hand."""

from cifarflow import slurm, slurm_queue
from cifarflow.controller.leftovers import leave_no_job_behind


def squeue_says(tmp_path, monkeypatch, text):
    monkeypatch.setattr(slurm, "ask", lambda argv, timeout_s=None: slurm.Reply(
        tuple(argv), "ok", text.format(here=tmp_path)))


def test_this_workflows_jobs_left_in_the_queue_are_found_by_folder_and_comment(
        tmp_path, monkeypatch):
    squeue_says(tmp_path, monkeypatch,
                "41|{here}|rule_train_cpu_wildcards_cpu_1|PENDING\n"
                "42|{here}/other|rule_train_cpu_wildcards_cpu_1|PENDING\n"  # another workflow
                "43|{here}|(null)|RUNNING\n"                  # not Snakemake's: the controller
                "44|{here}|rule_train_pack_wildcards_p_2|RUNNING\n"
                "45|{here}|rule_aggregate|COMPLETING\n")     # on its way out already
    assert slurm_queue.workflow_queued(str(tmp_path)) == [
        {"job": "41", "rule": "train_cpu_wildcards_cpu_1", "state": "PENDING"},
        {"job": "44", "rule": "train_pack_wildcards_p_2", "state": "RUNNING"}]


def test_left_jobs_are_cancelled_in_one_scancel_and_named():
    said, cancelled = [], []
    left = [{"job": "41", "rule": "train_cpu_wildcards_cpu_1", "state": "PENDING"}]

    def cancel(*jobs):
        cancelled.append(jobs)
        return slurm.Reply(("scancel", *jobs), "ok")

    assert leave_no_job_behind("w", said.append, lambda w: left, cancel) == ["41"]
    assert cancelled == [("41",)]
    assert said == ["the workflow ended with 1 job(s) of its own still in Slurm's queue, which "
                    "nothing waits for: cancelled 41 (train_cpu_wildcards_cpu_1, PENDING)"]
    assert leave_no_job_behind("w", said.append, lambda w: [], cancel) == []
    assert len(said) == 1 and len(cancelled) == 1  # nothing left: nothing said, no scancel


def test_a_failed_scancel_says_how_to_do_it_by_hand():
    said = []
    left = [{"job": "7", "rule": "r", "state": "PENDING"}]
    leave_no_job_behind("w", said.append, lambda w: left,
                        lambda *jobs: slurm.Reply(("scancel",), "timeout", detail="no answer"))
    assert said[0].startswith("WARNING: ") and said[0].endswith("(no answer): scancel 7")
