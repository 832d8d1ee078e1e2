"""The plan against the test cluster's limits, read from Slurm: a named partition's MaxTime
(cpubase_bycore_b1: 3 hours) and, from the accounting database, MaxSubmitJobs (100)."""

import pytest

from conftest import ROOT, snakemake
from cifarflow.controller.limits import read_limits

pytestmark = pytest.mark.slurm


def test_limits_read_from_the_test_cluster():
    """Partition cpubase_bycore_b1 has MaxTime=3:00:00; accounting answers with the
    user's MaxSubmitJobs."""
    limits = read_limits("cpubase_bycore_b1")
    assert limits["partition"] == "cpubase_bycore_b1" and limits["max_time_min"] == 180
    assert limits["accounting"] is True and limits["max_submit"] == 100


def test_dry_run_through_the_profile_refuses_a_runtime_above_a_named_partitions_max_time(tmp_path):
    config = ROOT / "config" / "config.yaml"
    named = tmp_path / "named.yaml"
    named.write_text("slurm: {partition: cpubase_bycore_b1}\nresources: {runtime: 200}\n")
    out = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm", check=False,
                    configfile=[config, named])
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert ("resources.runtime 200 min of 1 run(s) (e.g. cpu) is above partition "
            "cpubase_bycore_b1's MaxTime of 180 min: set resources.runtime to at most 180") in text
    ok = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm", configfile=config)
    assert "plan: 1 segment job(s) per round, 2 round(s), 2 segment job(s) in all, at most " \
           "20 queued at once (--jobs)" in ok.stdout + ok.stderr
    assert "MaxSubmitJobs 100" in ok.stdout + ok.stderr
