"""The controller as a Slurm job (`cifarflow controller-job`), as the admin of a site asks:
the workflow's Snakemake runs in a 1-core job routed like any other (no partition named,
the account mapped to def-cifar_cpu), submits the training jobs from there, and the command
follows its log and ends with the workflow's status."""

import re
import subprocess
from pathlib import Path

import pytest

from alliance import CPU_ACCOUNT
from conftest import ENV, PY, ROOT, slurm_job_prefix, summary_rows
from test_slurm import FAST_POLLING

pytestmark = pytest.mark.slurm
LOCAL = ROOT / "tests" / "configs" / "local" / "config.yaml"


def sacct(job: str, fields: str) -> str:
    return subprocess.run(["sacct", "-X", "-P", "-n", "-j", job, "-o", fields],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_workflow_runs_from_its_controller_job_and_is_followed_to_its_end(tmp_path):
    prefix = slurm_job_prefix(tmp_path)
    config = tmp_path / "config.yaml"  # 1-core segments: the controller holds a core of vm
    config.write_text(LOCAL.read_text().replace("cpus_per_task: 2", "cpus_per_task: 1"))
    out = subprocess.run(
        [str(Path(PY).parent / "cifarflow"), "controller-job", "--time", "30", "--",
         "-s", str(ROOT / "Snakefile"), "--configfile", str(config), *FAST_POLLING,
         "--slurm-jobname-prefix", prefix],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    job = re.search(r"\[controller-job\] Slurm job (\d+) runs the workflow: ", text).group(1)
    assert f"[controller-job] Slurm job {job} ended COMPLETED" in text
    # its log came back whole: Snakemake's own lines, from inside the job
    assert "You are running snakemake in a SLURM job context" in text
    assert re.search(r"\d+ of \d+ steps \(100%\) done", text), text[-3000:]
    # the controller job: 1 core, routed by the site (no partition named), the CPU account
    partition, account, cpus, state = sacct(job, "Partition,Account,AllocCPUS,State").split("|")
    assert (partition, account, cpus, state) == ("cpubase_bycore_b1", CPU_ACCOUNT, "1",
                                                 "COMPLETED")
    # the training jobs it submitted ran, on the CPU account, and trained the run
    rows = summary_rows(tmp_path)
    assert rows["cpu"]["status"] == "ok"
    segment_jobs = rows["cpu"]["slurm_job_ids"].split()
    assert len(segment_jobs) == 2 and job not in segment_jobs
    for segment_job in segment_jobs:
        assert sacct(segment_job, "Account,State") == f"{CPU_ACCOUNT}|COMPLETED"
