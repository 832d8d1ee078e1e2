"""Jobs that can never start, on the test cluster (partition debug: one node of 2 CPUs):
refused at `snakemake -n`, and named while the workflow waits for one that was submitted."""

import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import ROOT, snakemake, start_snakemake

pytestmark = pytest.mark.slurm
CONFIG = ROOT / "tests" / "configs" / "slurm" / "config.yaml"


def test_a_pack_too_wide_for_the_partition_is_refused_at_the_dry_run(tmp_path):
    wide = tmp_path / "wide.yaml"
    wide.write_text("slurm: {partition: debug}\nresources: {cpus_per_task: 1, mem_mb: 1000}\n"
                    "sweep: {lr: [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08]}\n"
                    "pack: {runs_per_job: 8}\n")
    out = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm", check=False,
                    configfile=[CONFIG, wide])
    text = out.stdout + out.stderr
    line = ("pack cpu-pack001 (8 runs) asks 8 task(s) of 1 CPU(s), 1000 MB per CPU, and "
            "partition debug can ever give one job 2 such task(s) (1 node(s): ")
    assert out.returncode != 0 and text.count(line) == 1, text[-3000:]
    assert "it would wait forever; set pack.runs_per_job: 2, or another partition" in text
    fits = tmp_path / "fits.yaml"
    fits.write_text(wide.read_text().replace("runs_per_job: 8", "runs_per_job: 2"))
    ok = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm",
                   configfile=[CONFIG, fits])
    assert "can ever give" not in ok.stdout + ok.stderr


def test_a_pending_job_that_will_never_start_is_named_once(tmp_path):
    """Every job of the workflow depends (slurm.extra) on a job that failed: each pends
    for DependencyNeverSatisfied, and the controller names it, once, within seconds."""
    failed = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-J", "cifarflow-fails",
                             "-D", str(tmp_path), "--wrap", "false"], capture_output=True,
                            text=True, check=True).stdout.strip()
    while subprocess.run(["squeue", "-h", f"-j{failed}", "-t", "all", "-o", "%T"],
                         capture_output=True, text=True).stdout.strip() != "FAILED":
        time.sleep(0.5)
    extra = tmp_path / "extra.yaml"
    extra.write_text(f'slurm: {{partition: debug, extra: "--dependency=afterok:{failed}", '
                     "pending_check_s: 1}\n")
    proc = start_snakemake(tmp_path, "--profile", ROOT / "profiles/slurm", "--slurm-status-command",
                           "squeue", configfile=[CONFIG, extra])
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    pattern = re.compile(r"Slurm job (\d+) \(([^)]+)\) is pending for DependencyNeverSatisfied "
                         r"in partition debug: a job it depends on failed; it will not start "
                         r"by itself: scancel \1")
    deadline, named = time.time() + 120, []
    while time.time() < deadline and not named and proc.poll() is None:
        named = [m for m in map(pattern.search, list(lines)) if m]
        time.sleep(0.5)
    time.sleep(3)  # three more looks: still named once
    proc.send_signal(signal.SIGINT)  # Ctrl-C: Snakemake cancels its jobs and ends
    proc.wait(timeout=120)
    reader.join(timeout=10)
    text = "".join(lines)
    for m in named:  # whatever the controller left behind
        subprocess.run(["scancel", m.group(1)])
    assert named, text[-3000:]
    ids = [m.group(1) for m in map(pattern.search, lines) if m]
    assert len(ids) == len(set(ids)) >= 1  # each named once
