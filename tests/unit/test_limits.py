"""The plan against the cluster's limits: what `snakemake -n` says and refuses."""

import pytest

from cifarflow.controller.limits import check_plan, slurm_minutes
from cifarflow.slurm import fields


@pytest.mark.parametrize("text, minutes", [
    ("UNLIMITED", None), ("INFINITE", None), ("30", 30), ("5:00", 5), ("2:00:00", 120),
    ("1-00:00:00", 1440), ("3-12", 3 * 1440 + 720), ("0:30:30", 30.5)])
def test_slurm_time_format(text, minutes):
    assert slurm_minutes(text) == minutes


LIMITS = {"partition": "cpubase", "max_time_min": 180.0, "max_job_count": "10000",
          "max_array_size": "1001", "accounting": True, "max_submit": 100}


def test_a_round_above_the_submit_limit_suggests_a_pack_size():
    lines, errors = check_plan(1000, 1000, 10, 10000, {60: ["cpu_lr0p1"]}, LIMITS, 20)
    assert errors == []
    assert lines[0] == ("plan: 1000 segment job(s) per round, 10 round(s), 10000 segment "
                        "job(s) in all, at most 20 queued at once (--jobs)")
    assert "pack.runs_per_job: 10 would submit a round at once" in lines[1]
    assert "MaxSubmitJobs 100" in lines[-1]


def test_runtime_above_max_time_and_jobs_above_the_submit_limit_are_refused():
    _, errors = check_plan(8, 8, 2, 16, {240: ["cpu_a", "cpu_b"], 60: ["cpu_c"]}, LIMITS, 200)
    assert len(errors) == 2
    assert errors[0].startswith("resources.runtime 240 min of 2 run(s) (e.g. cpu_a) is above "
                                "partition cpubase's MaxTime of 180 min: set resources.runtime "
                                "to at most 180")
    assert "--jobs 200 is above your MaxSubmitJobs of 100" in errors[1]


def test_without_slurm_one_line_says_so():
    lines, errors = check_plan(4, 4, 2, 8, {30: ["cpu"]}, None, None)
    assert errors == [] and lines[-1].startswith("cluster limits: no answer from Slurm here")


def test_scontrol_records_are_read_as_key_value_pairs():
    record = fields("PartitionName=short AllowGroups=ALL Default=NO MaxTime=00:05:00 "
                    "MaxNodes=UNLIMITED")
    assert record["PartitionName"] == "short" and slurm_minutes(record["MaxTime"]) == 5
