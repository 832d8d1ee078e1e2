"""Jobs that can never start, on the test cluster (partition cpubase_bycore_b1: one node of 2 CPUs):
refused at `snakemake -n`, and named while the workflow waits for one that was submitted."""

import re
import shutil
import signal
import subprocess
import threading
import time

import pytest

from conftest import ENV, ROOT, SLURM_RUNS, slurm_job_prefix, snakemake, snakemake_command
from alliance import CPU_ACCOUNT
from test_slurm import job_state, profile_args

pytestmark = pytest.mark.slurm
CONFIG = ROOT / "tests" / "configs" / "slurm" / "config.yaml"


def test_a_pack_too_wide_for_the_partition_is_refused_at_the_dry_run(tmp_path):
    wide = tmp_path / "wide.yaml"
    wide.write_text("slurm: {partition: cpubase_bycore_b1}\nresources: {cpus_per_task: 1, mem_mb: 1000}\n"
                    "sweep: {lr: [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08]}\n"
                    "pack: {runs_per_job: 8}\n")
    out = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm", check=False,
                    configfile=[CONFIG, wide])
    text = out.stdout + out.stderr
    line = ("pack cpu-pack001 (8 runs) asks 8 task(s) of 1 CPU(s), on 1 node(s), 1000 MB per "
            "CPU, and partition cpubase_bycore_b1 can ever give one job 2 such task(s) (1 node(s): ")
    assert out.returncode != 0 and text.count(line) == 1, text[-3000:]
    assert "it would wait forever; set pack.runs_per_job: 2, or another partition" in text
    fits = tmp_path / "fits.yaml"
    fits.write_text(wide.read_text().replace("runs_per_job: 8", "runs_per_job: 2"))
    ok = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm",
                   configfile=[CONFIG, fits])
    assert "can ever give" not in ok.stdout + ok.stderr


def test_a_pending_job_that_will_never_start_is_named_once(tmp_path):
    """Every job of the workflow depends (slurm.extra) on a job that failed: each pends
    for DependencyNeverSatisfied, and the controller names it, once, within seconds, and
    not again over its next three looks (counted: squeue is wrapped to log its calls)."""
    prefix = slurm_job_prefix(tmp_path)  # the cleanup fixture cancels what is left of them
    failed = subprocess.run(["sbatch", "--parsable", "-A", CPU_ACCOUNT, "-J", f"{prefix}_fails",
                             "-D", str(tmp_path), "--wrap", "false"], capture_output=True,
                            text=True, check=True).stdout.strip()
    deadline = time.time() + 120
    while job_state(failed) != "FAILED":
        assert time.time() < deadline, f"job {failed} never failed: {job_state(failed)}"
        time.sleep(0.5)
    looks = tmp_path / "squeue-calls"
    wrapper = tmp_path / "bin" / "squeue"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {looks}\nexec {shutil.which("squeue")} "$@"\n')
    wrapper.chmod(0o755)
    extra = tmp_path / "extra.yaml"
    extra.write_text(f'slurm: {{partition: cpubase_bycore_b1, extra: "--dependency=afterok:{failed}", '
                     "pending_check_s: 1}\n")
    proc = subprocess.Popen(
        snakemake_command(tmp_path, *profile_args(tmp_path),
                          configfile=[CONFIG, extra]),
        env={**ENV, "PATH": f"{wrapper.parent}:{ENV['PATH']}"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    SLURM_RUNS.append(proc)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    pattern = re.compile(r"Slurm job (\d+) \(([^)]+)\) is pending for DependencyNeverSatisfied "
                         r"in partition cpubase_bycore_b1: a job it depends on failed; it will not start "
                         r"by itself: scancel \1")

    def watch_looks() -> int:
        calls = looks.read_text().splitlines() if looks.exists() else []
        return sum(1 for call in calls if call.startswith("--me"))

    deadline, named = time.time() + 120, []
    while time.time() < deadline and not named and proc.poll() is None:
        named = [m for m in map(pattern.search, list(lines)) if m]
        time.sleep(0.5)
    assert named, "".join(lines)[-3000:]
    seen = watch_looks()
    while watch_looks() < seen + 3:  # the watch's next three looks, whatever the machine
        assert time.time() < deadline + 120 and proc.poll() is None, "the watch stopped looking"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: Snakemake cancels its jobs and ends
    proc.wait(timeout=120)
    reader.join(timeout=10)
    ids = [m.group(1) for m in map(pattern.search, lines) if m]
    assert len(ids) == len(set(ids)) >= 1  # each named once, over three more looks
