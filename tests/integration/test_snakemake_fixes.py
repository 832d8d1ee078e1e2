"""Snakemake's own bug that cifarflow works around: a restarted job lost when a
checkpoint finishes first (cifarflow/controller/snakemake_fixes.py)."""

import subprocess
from pathlib import Path

import pytest

from conftest import ENV, PY, ROOT

SNAKEFILE = Path(__file__).with_name("snakemake_fix") / "Snakefile"


def run(workdir, fix: bool):
    return subprocess.run(
        [str(Path(PY).parent / "snakemake"), "-s", str(SNAKEFILE), "--directory", str(workdir),
         "--cores", "2", "--scheduler", "greedy", "--retries", "1",
         "--config", f"scripts={ROOT / 'scripts'}", f"fix={int(fix)}"],
        capture_output=True, text=True, timeout=300, env=ENV)


@pytest.mark.parametrize("fix", [False, True])
def test_a_restarted_job_survives_a_checkpoint_that_finishes_first(tmp_path, fix):
    out = run(tmp_path, fix)
    text = out.stdout + out.stderr
    assert "Trying to restart job" in text
    if fix:
        assert out.returncode == 0, text[-3000:]
        assert (tmp_path / "fails_once").exists() and (tmp_path / "other.done").exists()
    else:  # Snakemake alone: the day this passes, the fix can go
        assert out.returncode != 0 and "BUG: Out of jobs ready to be started" in text, text[-3000:]


# ---- a job's Snakemake starts without asking slurmctld (job/snakemake_start.py) ---------
START = ROOT / "scripts" / "cifarflow" / "job" / "snakemake_start.py"


def asked_scontrol(tmp_path, argv: list[str]) -> tuple[subprocess.CompletedProcess, list]:
    """Run argv with an `scontrol` first on PATH that logs what it is asked."""
    bin_dir, log = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir(exist_ok=True)
    log.unlink(missing_ok=True)
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> {log}\necho "MinJobAge = 300 sec"\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {**ENV, "PATH": f"{bin_dir}:{ENV['PATH']}"}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    return out, log.read_text().splitlines() if log.exists() else []


def test_a_jobs_snakemake_starts_without_asking_the_scheduler(tmp_path):
    # Snakemake imports the Slurm plugin to read its command line; the plugin asks MinJobAge
    alone, asked = asked_scontrol(tmp_path, [PY, "-m", "snakemake", "--version"])
    assert alone.returncode == 0 and asked == ["show config"], (alone.stderr, asked)
    started, asked = asked_scontrol(tmp_path, [PY, str(START), "-m", "snakemake", "--version"])
    assert started.returncode == 0 and asked == [], (started.stderr, asked)
    assert started.stdout == alone.stdout  # the same Snakemake, the same answer
    wrong, _ = asked_scontrol(tmp_path, [PY, str(START), "--version"])
    assert wrong.returncode != 0 and "usage: snakemake_start.py -m snakemake" in wrong.stderr


def test_a_jobs_snakemake_loads_the_efficiency_report_and_pandas_at_first_use():
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import snakemake_start as s; "
             "assert s.efficiency_report_on_first_use(); import snakemake.cli; "
             "print('pandas' in sys.modules); from snakemake_executor_plugin_slurm import "
             "create_efficiency_report as report\n"
             "try: report()\n"
             "except TypeError as e: print(e)\n"
             "print('pandas' in sys.modules)")
    out = subprocess.run([PY, "-c", probe, str(START.parent)], capture_output=True, text=True,
                         timeout=300, env=ENV, check=True).stdout.splitlines()
    # not with the plugin; at the report's first call, the plugin's own function runs
    assert out[0] == "False" and "create_efficiency_report()" in out[1] and out[2] == "True", out


def test_the_jobs_command_goes_through_the_start_file_where_it_runs_this_python():
    from cifarflow.job.snakemake_start import command, start_through_this_file

    class Shared:  # the job runs the controller's Python (a shared software deployment)
        def get_python_executable(self):
            return PY

    class Own:  # the job has its own "python": the executor's command as it was
        def get_python_executable(self):
            return "python"

    for executor in (Shared, Own, Shared):  # a second call changes nothing
        start_through_this_file(executor)
    assert Shared().get_python_executable() == command(PY) == f"{PY} {START}"
    assert Own().get_python_executable() == "python"
