"""The plan against the test cluster's limits (partition short: MaxTime=5, no accounting)."""

import pytest

from conftest import ROOT, snakemake
from cifarflow.controller.limits import read_limits

pytestmark = pytest.mark.slurm


def test_limits_read_from_the_test_cluster():
    """The test cluster: partition short has MaxTime=5, no accounting."""
    limits = read_limits("short")
    assert limits["partition"] == "short" and limits["max_time_min"] == 5
    assert limits["accounting"] is False and limits["max_submit"] is None
    assert read_limits("")["partition"] == "debug"  # the default partition


def test_dry_run_through_the_profile_refuses_a_runtime_above_max_time(tmp_path):
    config = ROOT / "config" / "config.yaml"
    short = tmp_path / "short.yaml"
    short.write_text("slurm: {partition: short}\nresources: {runtime: 30}\n")
    out = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm", check=False,
                    configfile=[config, short])
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert ("resources.runtime 30 min of 1 run(s) (e.g. cpu) is above partition short's "
            "MaxTime of 5 min: set resources.runtime to at most 5") in text
    ok = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm", configfile=config)
    assert "plan: 1 segment job(s) per round, 2 round(s), 2 segment job(s) in all, at most " \
           "20 queued at once (--jobs)" in ok.stdout + ok.stderr
    assert "MaxSubmitJobs: unknown (no accounting: sacctmgr says nothing)" in ok.stdout + ok.stderr
