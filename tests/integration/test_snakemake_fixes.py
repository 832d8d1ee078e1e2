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
