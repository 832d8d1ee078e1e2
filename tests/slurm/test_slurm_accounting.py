"""Used against requested from the test cluster's accounting (slurmdbd): the summary's CPU
efficiency, peak memory and runtime come from one sacct call, and agree within reason with
what the engine measured itself (kept beside them): a pack of two cpu members (each its
own step, named after it) and two ddp runs alone (2 srun tasks each)."""

import pytest

from conftest import summary_rows
from test_slurm import slurm

pytestmark = pytest.mark.slurm

CONFIG = """\
strategies: [cpu, ddp]
data: {source: synthetic, synthetic: {train_size: 4000, test_size: 400}}
train: {epochs: 3, batch_size: 100, log_interval_s: 5}
distributed: {world_size: 2, nodes: 1, device: cpu}
segments: {count: 1}
resources: {cpus_per_task: 1, mem_mb: 1500, runtime: 10}
sweep: {lr: [0.01, 0.02]}
pack: {runs_per_job: 2}
slurm: {account: def-cifar_cpu}
"""


def test_the_summary_uses_sacct_and_agrees_with_the_engine(tmp_path):
    config = tmp_path / "accounting.yaml"
    config.write_text(CONFIG)
    slurm(tmp_path, configfile=config, env={"SLURM_ACCOUNT": "def-cifar_cpu"})
    rows = summary_rows(tmp_path)
    assert sorted(rows) == ["cpu_lr0p01", "cpu_lr0p02", "ddp_lr0p01", "ddp_lr0p02"]
    for name, row in rows.items():
        figures = {k: row[k] for k in ("usage_from", "cpu_efficiency", "cpu_efficiency_measured",
                                       "mem_used_mb", "mem_used_measured_mb", "runtime_used_min",
                                       "runtime_used_measured_min", "slurm_job_ids")}
        assert row["status"] == "ok" and row["usage_from"] == "sacct", figures
        used, measured = float(row["mem_used_mb"]), float(row["mem_used_measured_mb"])
        # Slurm samples every second what the engine's getrusage saw at its peak; the step
        # holds the launcher's shell too
        assert 0.5 * measured < used < 2 * measured, figures
        assert 0 < float(row["cpu_efficiency"]) <= 1.05, figures
        assert abs(float(row["cpu_efficiency"]) - float(row["cpu_efficiency_measured"])) < 0.5, \
            figures
        # the job (or a member's step) holds the training and its start-up, within the limit
        runtime = float(row["runtime_used_min"])
        assert float(row["runtime_used_measured_min"]) <= runtime * 1.05 + 0.05, figures
        assert runtime <= float(row["runtime_requested_min"]), figures
    assert rows["cpu_lr0p01"]["slurm_job_ids"] == rows["cpu_lr0p02"]["slurm_job_ids"]  # a pack
    # the pack's members are the tasks of one step (job/pack_step.py): each counts the
    # step's largest task as its memory, not the two tasks' sum
    assert rows["cpu_lr0p01"]["mem_used_mb"] == rows["cpu_lr0p02"]["mem_used_mb"]
