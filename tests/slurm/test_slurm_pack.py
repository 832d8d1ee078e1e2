"""Packed segments on the test cluster: several sweep members per allocation, spread over
two nodes, each a Slurm step of its own."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import assert_bit_identical, final_states, summary_rows, sweep_config, training_spec
from test_slurm import start_slurm, submitted, training_processes

pytestmark = pytest.mark.slurm


def running_pack_jobs() -> dict:
    """job id -> pack wildcards of the running pack jobs (from the plugin's comment)."""
    out = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i %k"], capture_output=True,
                         text=True).stdout.split()
    return {j: c for j, c in zip(out[0::2], out[1::2]) if c.startswith("rule_train_cpu_")}


def test_slurm_pack_spreads_over_two_nodes_equals_unpacked_and_retries_one_member(
        tmp_path, unpacked_sweep):
    """16 runs in packs of 4 on partition multi (n1 and n2, 2 cores each): 4 jobs per
    round, each of 4 one-core tasks that Slurm spreads over both nodes. One member is
    SIGKILLed while it trains; only it is retried. Final weights equal the unpacked
    sweep's bit for bit."""
    config = sweep_config(tmp_path / "c.yaml", 16, 4)
    multi = tmp_path / "multi.yaml"
    multi.write_text("slurm: {partition: multi}\n")
    proc = start_slurm(tmp_path, config, multi, args=["--verbose"])
    deadline, victim = time.time() + 600, None
    while victim is None and time.time() < deadline and proc.poll() is None:
        for jobid in running_pack_jobs():
            for pid in training_processes(jobid):
                spec = training_spec(pid)
                os.kill(pid, signal.SIGKILL)
                victim = spec.split("/")[2]  # results/runs/<run>/spec.json
                break
            if victim:
                break
        time.sleep(0.05)
    output = proc.communicate(timeout=900)[0]
    assert victim, "no member process seen in a running pack job"
    assert proc.returncode == 0, output[-4000:]
    calls = [c for c in output.splitlines() if "sbatch call" in c and "rule_train_cpu" in c]
    assert len(calls) == 4 * 2 + 1 and all(
        "--ntasks=4 --cpus-per-task=1" in c and "--mem-per-cpu 1000" in c for c in calls)
    packs = sorted(set(re.findall(r"rule_train_cpu_wildcards_(cpu-pack\d+_\d+)", output)))
    assert len(packs) == 4 * 2  # 4 packs, 2 segments
    assert len(set(submitted(output)["train_cpu"])) == 4 * 2 + 1  # and the one retry
    logs = tmp_path / "results/logs/train"
    retried = sorted(p.parent.name for p in logs.glob("*/segment-*.attempt2.log"))
    assert retried == [victim]
    rows = summary_rows(tmp_path)
    assert {r["status"] for r in rows.values()} == {"ok"} and len(rows) == 16
    record = json.loads((tmp_path / "results/packs/cpu-pack001/segment-2.json").read_text())
    hosts = {h for run in record["members"] for h in rows[run]["hosts"].split()}
    assert hosts == {"n1", "n2"}  # one job, its members on both nodes
    for run, state in final_states(tmp_path).items():
        assert_bit_identical(state["model"], unpacked_sweep[run]["model"])
