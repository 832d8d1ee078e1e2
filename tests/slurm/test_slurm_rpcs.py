"""Gentle on the scheduler, as the scheduler counts it: a packed sweep (4 one-core runs in
packs of 2, 2 segments: 4 pack jobs and the environment record), its RPCs counted by
slurmctld itself (sdiag, reset first) and every Slurm command of the workflow's processes
counted by wrappers first on PATH (the controller, the plugin, the jobs). Asserted: what
does not depend on timing (submissions, one job step per pack job, the plan's cluster reads
once per controller); the figures per job go to bench/README.md (bench/scheduler_rpcs.py)."""

import os
import subprocess
from collections import Counter

import pytest

from conftest import sweep_config, summary_rows
from cifarflow import slurm_queue
from test_slurm import logged_calls, logged_clients, slurm as run_slurm

pytestmark = pytest.mark.slurm


def test_a_packed_sweep_costs_one_step_per_pack_job_and_reads_the_cluster_once(tmp_path):
    config = sweep_config(tmp_path / "sweep.yaml", runs=4, runs_per_job=2, mem_mb=1000)
    path, log = logged_clients(tmp_path)
    assert slurm_queue.reset_rpc_counts()
    out = run_slurm(tmp_path, configfile=config, env={"PATH": path})
    counts = slurm_queue.rpc_counts()
    rows = summary_rows(tmp_path)
    assert len(rows) == 4 and {r["status"] for r in rows.values()} == {"ok"}
    print("\nsdiag after the sweep:", dict(sorted(counts.items())))
    made = [(job, call) for _, job, call in logged_calls(log)]
    by_command = Counter(call.split()[0] + " " + (call.split() + [""])[1] for _, call in made)
    print("Slurm commands of the workflow's processes:", dict(by_command.most_common()))
    # 2 packs x 2 segments, and record_environment: nothing else is submitted
    jobs = {job for row in rows.values() for job in row["slurm_job_ids"].split()}
    assert len(jobs) == 4
    submitted = [call for _, call in made if call.startswith("sbatch --parsable ")]
    assert len(submitted) == 5
    assert counts["REQUEST_SUBMIT_BATCH_JOB"] >= 5  # this sweep's, and nothing of ours more
    # where each job goes, asked of Slurm once per distinct request (will_run.py): the
    # packs ask alike, the environment record otherwise
    asked = [call for job, call in made if call.startswith("sbatch --test-only ")]
    assert len(asked) == 2 and {job for job, call in made if "--test-only" in call} == {"-"}
    assert counts["REQUEST_JOB_WILL_RUN"] >= 2
    # one job step per pack job (its members are the tasks of that step), one srun each
    steps = subprocess.run(["sacct", "-n", "-P", "-j", ",".join(sorted(jobs)), "-o", "JobID"],
                           capture_output=True, text=True, check=True).stdout.split()
    numbered = Counter(s.split(".")[0] for s in steps if "." in s and s.split(".")[1].isdigit())
    assert {job: numbered[job] for job in jobs} == {job: 1 for job in jobs}, numbered
    assert Counter(job for job, call in made if call.startswith("srun ") and job in jobs) == \
        {job: 1 for job in jobs}
    # the plan asks the cluster once per controller process: its config, partitions, nodes,
    # the user's accounts and limits
    controller = Counter(call for job, call in made if job == "-")
    for read in ("scontrol -a -o show partition", "scontrol -a -o show node"):
        assert controller[read] == 1, (read, controller)
    assert sum(n for call, n in controller.items() if call.startswith("sacctmgr")) == 4, controller
    # and so does the executor plugin, through snakemake_fixes.ask_the_scheduler_once: its
    # MinJobAge (at every status check) and its account check (at every sbatch), once; what
    # is left: ours, and the plugin's while Snakemake parses its command line, before the
    # workflow is read (exact counts: none of them depends on timing)
    assert controller["scontrol show config"] == 5, controller
    assert controller[f"sacctmgr -n -s list user {os.environ.get('USER', 'root')} "
                      "format=account%256"] == 1, controller
    # a job asks one thing, once: its own record (its end and its wait); its Snakemakes
    # start through job/snakemake_start.py, so the plugin's import asks nothing (it asked
    # `scontrol show config` in both: 4 RPCs a job)
    in_jobs = Counter(job for job, _ in made if job != "-")
    assert {job: n for job, n in in_jobs.items() if job in jobs} == {job: 2 for job in jobs}
    assert Counter(job for job, call in made if call == f"scontrol show job {job}") == \
        {job: 1 for job in in_jobs}, made
