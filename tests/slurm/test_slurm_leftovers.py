"""Nothing of ours left in the queue: a copy of a segment's job that Slurm requeued after
its batch script ended (here: requeued and held by hand once the segment was published and
the next segment submitted, as the fault soak saw it happen by itself) is no job Snakemake
waits for; when the workflow ends, its main process cancels it and says so, and the queue
holds no job of the workflow's."""

import re
import subprocess
import time

import pytest

from conftest import ROOT, slurm_job_prefix, slurm_jobs
from test_slurm import start_slurm, train_job_id

pytestmark = pytest.mark.slurm
LOCAL = ROOT / "tests" / "configs" / "local" / "config.yaml"


def test_a_requeued_copy_of_a_finished_segment_is_cancelled_when_the_workflow_ends(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(LOCAL.read_text().replace("cpus_per_task: 2", "cpus_per_task: 1"))
    proc = start_slurm(tmp_path, config)
    first = second = None
    deadline = time.time() + 600
    while not second and proc.poll() is None and time.time() < deadline:
        first = first or train_job_id(tmp_path, "rule_train_cpu_wildcards_cpu_1")
        second = train_job_id(tmp_path, "rule_train_cpu_wildcards_cpu_2")
        time.sleep(0.5)
    assert first and second, "segment 2 was never submitted"
    # Snakemake saw segment 1 complete (it submitted segment 2): Slurm requeues its job
    subprocess.run(["scontrol", "requeuehold", first], check=True, capture_output=True)
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, out[-4000:]
    assert re.search(rf"\[cifarflow\] the workflow ended with 1 job\(s\) of its own still in "
                     rf"Slurm's queue, which nothing waits for: cancelled {first} "
                     rf"\(train_cpu_wildcards_cpu_1, PENDING\)", out), out[-3000:]
    left = {job: state for job, (state, _) in slurm_jobs(slurm_job_prefix(tmp_path)).items()
            if state in ("PENDING", "RUNNING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD")}
    assert left == {}, left
