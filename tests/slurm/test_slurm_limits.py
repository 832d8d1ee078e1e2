"""The plan against the test cluster's limits (Alliance-shaped: accounting with
MaxSubmitJobs=100 on the def-cifar_* associations; partition cpubase_bycore_b1 MaxTime 3 h)."""

import pytest

from conftest import ROOT, snakemake
from cifarflow.controller.limits import read_limits

pytestmark = pytest.mark.slurm


def test_limits_read_from_the_test_cluster():
    limits = read_limits()
    assert limits["accounting"] is True and limits["max_submit"] == 100


def test_dry_run_through_the_profile_refuses_a_runtime_above_a_named_partitions_max_time(
        tmp_path):
    config = ROOT / "config" / "config.yaml"
    short = tmp_path / "short.yaml"
    short.write_text("slurm: {partition: cpubase_bycore_b1}\nresources: {runtime: 240}\n")
    env = {"SLURM_ACCOUNT": "def-cifar"}
    out = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm", check=False,
                    configfile=[config, short], env=env)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert ("resources.runtime 240 min of run cpu is above partition cpubase_bycore_b1's "
            "MaxTime of 180 min: set resources.runtime to at most 180") in text
    ok = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm", configfile=config,
                   env=env)
    assert "plan: 1 segment job(s) per round, 2 round(s), 2 segment job(s) in all, at most " \
           "20 queued at once (--jobs)" in ok.stdout + ok.stderr
    assert "MaxSubmitJobs 100" in ok.stdout + ok.stderr
