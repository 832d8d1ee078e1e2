"""Packed segments on the test cluster: several sweep members per allocation, spread over
two nodes, each a Slurm step of its own."""

import json
import os
import re
import signal
import time

import pytest

from conftest import (assert_bit_identical, cli, final_states, run_batches, state_of,
                      summary_rows, sweep_config, train_until_saved, training_spec)
from test_slurm import running_jobs, slurm, start_slurm, submitted, training_processes

pytestmark = pytest.mark.slurm


def running_pack_jobs(workdir) -> list[str]:
    """The running pack jobs of the workflow run in `workdir` (from the plugin's comment)."""
    return [j for j, c in running_jobs(workdir).items() if c.startswith("rule_train_cpu_")]


def trained_alone(workdir, run: str, out) -> dict:
    """The run's spec trained in one go by one local process: its final weights."""
    cli("train", "--spec", workdir / f"results/runs/{run}/spec.json", "--data",
        run_batches(workdir, run), "--out", out, "--threads", 1, timeout=900)
    return state_of(out)["model"]


# a pack equals its runs alone and retries only its killed member: tests/integration/
# test_pack.py; Slurm spreads a pack over both nodes: the job venv test below
@pytest.mark.variant
def test_slurm_pack_spreads_over_two_nodes_equals_unpacked_and_retries_one_member(tmp_path):
    """8 runs in packs of 4 on partition multi (n1 and n2, 2 cores each): 2 jobs per
    round, each of 4 one-core tasks that Slurm spreads over both nodes (pack.nodes: any).
    One member is SIGKILLed after its first in-segment save (frozen from its start, it
    trains in short steps until the save exists); only it is retried, from that save's
    batch. Its final weights, and another member's, equal the run trained alone in one go
    bit for bit (every member against the unpacked sweep: tests/integration/test_pack.py).
    Slurm kills a step above its memory (polling): a member peaks at about 800 MB there
    (launcher and training process), so each asks 2000 MB, else the frozen victim could be
    killed for memory and retried with more."""
    config = sweep_config(tmp_path / "c.yaml", 8, 4, train="checkpoint_interval_s: 0.001",
                          mem_mb=2000)
    multi = tmp_path / "multi.yaml"
    multi.write_text("slurm: {partition: multi}\npack: {nodes: any}\n")  # spread: both nodes
    proc = start_slurm(tmp_path, config, multi, args=["--verbose"])
    deadline, victim, saved = time.time() + 600, None, None
    while victim is None and time.time() < deadline and proc.poll() is None:
        for jobid in running_pack_jobs(tmp_path):
            for pid in training_processes(jobid):
                victim = training_spec(pid).split("/")[2]  # results/runs/<run>/spec.json
                saved = train_until_saved([pid], tmp_path / f"results/runs/{victim}/work")
                os.kill(pid, signal.SIGKILL)
                break
            if victim:
                break
        time.sleep(0.01)
    output = proc.communicate(timeout=900)[0]
    assert victim, "no member process seen in a running pack job"
    assert proc.returncode == 0, output[-4000:]
    assert not saved["done"] and 1 <= saved["step"] < 10, saved
    calls = [c for c in output.splitlines() if "sbatch call" in c and "rule_train_cpu" in c]
    asks = [re.search(r"--comment (\S+).*?(--mem-per-cpu \d+).*?(--ntasks=\d+ --cpus-per-task=\d+)",
                      c).groups() for c in calls]
    killed = (tmp_path / f"results/logs/train/{victim}").glob("segment-*.attempt1.log")
    assert len(calls) == 2 * 2 + 1 and all(
        a[1:] == ("--mem-per-cpu 2000", "--ntasks=4 --cpus-per-task=1") for a in asks), \
        (asks, [log.read_text()[-1000:] for log in killed])
    packs = sorted(set(re.findall(r"rule_train_cpu_wildcards_(cpu-pack\d+_\d+)", output)))
    assert len(packs) == 2 * 2  # 2 packs, 2 segments
    assert len(set(submitted(output)["train_cpu"])) == 2 * 2 + 1  # and the one retry
    logs = tmp_path / "results/logs/train"
    retried = sorted(p.parent.name for p in logs.glob("*/segment-*.attempt2.log"))
    assert retried == [victim]
    retry = next(logs.glob(f"{victim}/segment-*.attempt2.log")).read_text()
    assert (f"resumed from results/runs/{victim}/work at epoch {saved['epoch'] + 1}, batch "
            f"{saved['step']}\n" in retry), retry[-2000:]
    rows = summary_rows(tmp_path)
    assert {r["status"] for r in rows.values()} == {"ok"} and len(rows) == 8
    record = json.loads((tmp_path / "results/packs/cpu-pack001/segment-2.json").read_text())
    hosts = {h for run in record["members"] for h in rows[run]["hosts"].split()}
    assert hosts == {"n1", "n2"}  # one job, its members on both nodes
    finals = final_states(tmp_path)
    assert len(finals) == 8
    for run in (victim, next(run for run in sorted(finals) if run != victim)):
        assert_bit_identical(finals[run]["model"], trained_alone(tmp_path, run, tmp_path / run))


def test_a_pack_spread_over_two_nodes_builds_its_job_venv_on_each(tmp_path):
    """env.mode slurm_tmpdir with a pack of 4 one-core members on partition multi (2 cores a
    node): Slurm places members on both nodes, so the prologue builds the venv on every node
    the job holds (before, it built it on the batch node alone, and members elsewhere found
    no Python). Each member runs its own node's venv. The venvs hold a small wheel from a
    wheelhouse; torch comes from the project venv through env.pythonpath (jobs are given
    no login-shell PYTHONPATH)."""
    import subprocess
    from pathlib import Path

    from conftest import PY, probe_wheel, slurm_job_prefix, slurm_jobs

    wheels = probe_wheel(tmp_path / "wheelhouse")
    site = subprocess.run([PY, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "job-requirements.txt").write_text("cifarflow-probe==0.1\n")
    config = sweep_config(tmp_path / "c.yaml", 4, 4, mem_mb=2000)
    extra = tmp_path / "multi.yaml"
    extra.write_text(json.dumps({
        "slurm": {"partition": "multi"}, "segments": {"count": 1}, "pack": {"nodes": "any"},
        "env": {"mode": "slurm_tmpdir", "requirements": str(tmp_path / "job-requirements.txt"),
                "find_links": str(wheels), "pythonpath": [site]}}))
    out = slurm(tmp_path, configfile=[config, extra],
                env={"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""})
    (job,) = submitted(out.stdout + out.stderr)["train_cpu"]
    venv = f"/localscratch/root.{job}.0/env"
    pack_log = next((tmp_path / "results/logs/packs").glob("cpu-pack*/segment-1.log")).read_text()
    for node in ("n1", "n2"):
        assert f"[env] {node}: {venv} ready" in pack_log, pack_log[-3000:]
    hosts = set()
    for log in (tmp_path / "results/logs/train").glob("*/segment-1.log"):
        found = re.search(r"ranks: 0 on (n\d) \(python (\S+)\)", log.read_text())
        assert found and found[2] == venv, log.read_text()[-2000:]
        hosts.add(found[1])
    assert hosts == {"n1", "n2"}  # the members were spread, and each found its venv
    assert slurm_jobs(slurm_job_prefix(tmp_path), "PENDING,RUNNING") == {}
