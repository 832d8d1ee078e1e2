"""Requests that learn, on the test cluster (which enforces memory: jobacct_gather's
OverMemoryKill, tests/slurm/cluster.sh; production clusters use cgroups, whose kill sets
the job state OUT_OF_MEMORY, which cifarflow reads too): the next segment's sbatch line
asks for what the last one used, and a segment killed for memory succeeds on a retry that
asks for more."""

import json
import math
import re

import pytest

from conftest import summary_rows
from alliance import GPU_ACCOUNT
from test_slurm import job_state, slurm, submitted

pytestmark = pytest.mark.slurm
DATA = "data: {source: synthetic, synthetic: {train_size: 3000, test_size: 200}}\n"


def sbatch_calls(text: str, rule: str) -> dict:
    """wildcards (<run>_<segment>) -> (--mem, --time) of each sbatch call of the rule."""
    calls = {}
    for line in text.splitlines():
        found = re.search(rf"sbatch call: .*rule_{rule}_wildcards_(\S+?)['\" ]", line)
        if found:
            mem = re.search(r"--mem[ =](\d+)", line)
            runtime = re.search(r"(?:-t|--time)[ =](\d+)", line)
            calls.setdefault(found.group(1), []).append(
                (int(mem.group(1)) if mem else None, int(runtime.group(1)) if runtime else None))
    return calls


def test_a_run_asking_far_more_than_it_uses_asks_less_for_its_next_segment(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("strategies: [cpu]\n" + DATA +
                      "train: {epochs: 2, batch_size: 100, log_interval_s: 100}\n"
                      "segments: {count: 2}\n"
                      "resources: {cpus_per_task: 1, mem_mb: 6000, runtime: 20, autosize: true}\n")
    out = slurm(tmp_path, configfile=config)
    text = out.stdout + out.stderr
    calls = sbatch_calls(text, "train_cpu")
    meta = json.loads((tmp_path / "results/runs/cpu/segment-2/checkpoint.json").read_text())
    first = next(t for t in meta["segment_runs"] if t["segment"] == "segment-1")
    mem = max(256, 100 * math.ceil(max(first["peak_rss_mb_per_node"].values()) * 1.3 / 100))
    # the measured time x 1.3 and the stop margin (60 s), never below autosize_min_runtime (10)
    minutes = min(20, max(10, math.ceil((first["wall_s"] * 1.3 + 60) / 60)))
    assert calls["cpu_1"] == [(6000, 20)]
    assert calls["cpu_2"] == [(mem, minutes)] and mem < 6000 and minutes < 20
    # the smaller request held (the cluster enforces memory)
    assert [job_state(j) for j in submitted(text)["train_cpu"]] == ["COMPLETED"] * 2
    row = summary_rows(tmp_path)["cpu"]
    assert (row["status"], row["mem_requested_last_mb"]) == ("ok", str(mem))
    assert row["try_ends"] == "completed 2"


# A model whose memory grows once it trained a few batches (a cache that keeps growing), on
# its first try only (its mark file): by `mb` MB, touched; then its process stays as it is
# (SIGSTOP), so the cluster's memory check sees it however fast the machine trains.
GROWING_MODEL = """
import os
import signal
from pathlib import Path

import torch
from torch import nn


class GrowsOnItsFirstTry(nn.Module):
    def __init__(self, mb, after):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(8 * 30 * 30, 10))
        self.mb, self.after, self.calls, self.held = mb, after, 0, None

    def forward(self, x):
        self.calls += self.training
        if self.training and self.calls == self.after and not Path("grown").exists():
            Path("grown").write_text("the first try grew")
            self.held = torch.ones(self.mb * 2**18)
            os.kill(os.getpid(), signal.SIGSTOP)
        return self.net(x)


def make(mb, after):
    return GrowsOnItsFirstTry(mb, after)
"""


def test_a_segment_killed_for_memory_resumes_on_its_retry_with_more(tmp_path):
    """The segment saves after every batch; in its third batch its model grows by 2000 MB
    (its first try only) and holds it: Slurm kills the step for memory. The retry asks for
    oom_factor x the memory and resumes from the in-segment checkpoint, at the batch of
    the last save (the second)."""
    (tmp_path / "growing.py").write_text(GROWING_MODEL)
    config = tmp_path / "c.yaml"
    config.write_text("strategies: [cpu]\n" + DATA +
                      "train: {epochs: 2, batch_size: 100, log_interval_s: 100, "
                      "checkpoint_interval_s: 0.000001, model: 'growing:make', "
                      "model_args: {mb: 2000, after: 3}}\n"
                      "segments: {count: 1}\n"
                      "resources: {cpus_per_task: 1, mem_mb: 1500, runtime: 10, oom_factor: 2}\n")
    out = slurm(tmp_path, configfile=config)  # profiles/slurm: retries 2
    text = out.stdout + out.stderr
    assert (tmp_path / "grown").exists()
    assert sbatch_calls(text, "train_cpu")["cpu_1"] == [(1500, 10), (3000, 10)]
    first, second = dict.fromkeys(submitted(text)["train_cpu"])  # in order, once each
    # the step was killed, not the job: the job is FAILED and the step's log says why
    assert (job_state(first), job_state(second)) == ("FAILED", "COMPLETED")
    logs = tmp_path / "results/logs/train/cpu"
    killed = (logs / "segment-1.attempt1.log").read_text()
    assert re.search(rf"exceeded memory limit \(\d+ > {1500 * 2**20}\), being killed", killed)
    assert "cpu segment 1: 1 try ran out of memory: 3000 MB" in text
    assert ("resumed from results/runs/cpu/work at epoch 1, batch 2\n" in
            (logs / "segment-1.attempt2.log").read_text())
    row = summary_rows(tmp_path)["cpu"]
    assert (row["status"], row["try_ends"]) == ("ok", "completed 1, out of memory 1")
    assert row["mem_requested_last_mb"] == "3000"


def test_each_rank_of_a_gpu_job_is_bound_to_its_own_gpu(tmp_path):
    """`cifarflow launch --gpus-per-task 1`, as the plan starts ranks that each train on a GPU
    (ddp, fsdp, lightning and gpu on cuda): in a job holding 2 of n1's (fake) GPUs, srun
    gives each rank's task one GPU of its own; without the flag each sees both."""
    import subprocess
    import sys

    from conftest import ENV, ROOT

    show = 'echo "rank $SLURM_PROCID sees $CUDA_VISIBLE_DEVICES"'
    launch = f"{sys.executable} -m cifarflow launch --nproc 2"
    script = (f"{launch} --gpus-per-task 1 -- bash -c '{show}'; echo ---; "
              f"{launch} -- bash -c '{show}'")
    out = tmp_path / "job.out"
    subprocess.run(["sbatch", "--wait", "-A", GPU_ACCOUNT, "-p", "multi", "-N1", "-n2", "--gres=gpu:2",
                    "--mem=1000", "-J", f"{tmp_path.name}-gpubind", "-o", str(out),
                    "--wrap", script], check=True, capture_output=True, timeout=300,
                   env={**ENV, "PYTHONPATH": str(ROOT / "scripts")}, cwd=tmp_path)
    lines = [l for l in out.read_text().splitlines() if l.startswith(("rank", "---"))]
    bound, unbound = lines[:lines.index("---")], lines[lines.index("---") + 1:]
    assert sorted(bound) == ["rank 0 sees 0", "rank 1 sees 1"], out.read_text()
    assert sorted(unbound) == ["rank 0 sees 0,1", "rank 1 sees 0,1"]
