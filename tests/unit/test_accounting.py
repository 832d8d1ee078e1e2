"""Used against requested from Slurm's accounting: sacct's fields parsed (sizes, durations),
each run's figures from its jobs (a run alone: its job; a pack member: its own steps), the
summary's measured figures kept beside them, and the one sacct call. The sacct lines are
recorded on the test cluster (Slurm 22.05, jobacct_gather/linux): job 5 a run alone (its
training in step 0), job 7 a pack of two members (steps named after them) and a 2-task
step."""

import shutil

import pytest

from cifarflow import slurm
from cifarflow.results.accounting import duration_s, parse_sacct, run_usage, size_mb, \
    with_accounting

RECORDED = """\
5|wrap|00:00:06|00:03.255|2||1000M|00:05:00|COMPLETED|
5.batch|batch|00:00:06|00:00.014|2|10844K|||COMPLETED|1
5.0|member1|00:00:04|00:03.137|2|218200K|||COMPLETED|1
5.1|python3|00:00:02|00:00.103|2|115804K|||COMPLETED|1
7|wrap|00:00:06|00:03.408|2||800M|1-00:00:00|COMPLETED|
7.batch|batch|00:00:06|00:00.019|2|19892K|||COMPLETED|1
7.0|cpu_lr0p1|00:00:03|00:03.117|1|166964K|||COMPLETED|1
7.1|cpu_lr0p2|00:00:03|00:00.084|1|74836K|||COMPLETED|1
7.2|python3|00:00:02|00:00.186|2|95484K|||COMPLETED|2
"""


def test_sacct_durations_and_sizes():
    assert duration_s("00:00:06") == 6 and duration_s("1-00:00:00") == 86400
    assert duration_s("00:03.255") == pytest.approx(3.255)  # TotalCPU: MM:SS.fff
    assert duration_s("2-03:04:05") == 2 * 86400 + 3 * 3600 + 4 * 60 + 5
    assert duration_s("12:34:56.5") == pytest.approx(12 * 3600 + 34 * 60 + 56.5)
    assert [duration_s(t) for t in ("UNLIMITED", "INVALID", "Partition_Limit", "")] == [None] * 4
    assert size_mb("218200K") == pytest.approx(213.086, abs=1e-3)
    assert (size_mb("1000M"), size_mb("4G"), size_mb("4000Mc"), size_mb("2.5G")) == \
        (1000, 4096, 4000, 2560)
    assert size_mb("0") == 0 and size_mb("") is None


def test_recorded_sacct_lines_by_job_and_step():
    jobs = parse_sacct(RECORDED + "garbage line\n")
    assert sorted(jobs) == ["5", "7"]
    job = jobs["7"]["job"]
    assert (job["elapsed_s"], job["cpus"], job["req_mem_mb"], job["limit_s"], job["state"]) == \
        (6, 2, 800, 86400, "COMPLETED")
    assert [(s["step"], s["name"], s["tasks"]) for s in jobs["7"]["steps"]] == [
        ("batch", "batch", 1), ("0", "cpu_lr0p1", 1), ("1", "cpu_lr0p2", 1), ("2", "python3", 2)]


def test_a_run_alone_counts_its_job_and_a_pack_member_its_own_steps():
    jobs = parse_sacct(RECORDED)
    alone = run_usage(jobs, ["5"], "cpu")
    assert alone["cpu_efficiency"] == pytest.approx(3.255 / (6 * 2))
    assert alone["mem_used_mb"] == pytest.approx(218200 / 1024)  # its largest step
    assert alone["runtime_used_min"] == pytest.approx(0.1)
    member = run_usage(jobs, ["7"], "cpu_lr0p1")
    assert member["cpu_efficiency"] == pytest.approx(3.117 / 3)
    assert member["mem_used_mb"] == pytest.approx(166964 / 1024)
    assert member["runtime_used_min"] == pytest.approx(0.05)
    two = run_usage(parse_sacct(RECORDED.replace("|cpu_lr0p1|", "|a|").replace(
        "|cpu_lr0p2|", "|b|")), ["7"], "ddp")  # a 2-task step: its largest task x 2
    assert two["mem_used_mb"] == pytest.approx(max(95484 * 2, 166964) / 1024)
    assert run_usage(jobs, ["99"], "cpu") is None and run_usage(jobs, [], "cpu") is None
    both = run_usage(jobs, ["5", "7"], "cpu_lr0p2")  # 5 has no step of its own: its job
    assert both["cpu_efficiency"] == pytest.approx((3.255 + 0.084) / (6 * 2 + 3 * 1))


def test_the_summary_takes_sacct_figures_and_keeps_the_measured_ones():
    measured = {"cpu_efficiency": 0.9, "mem_used_mb": 180.0, "runtime_used_min": 0.04}
    rows = [{"run": "cpu_lr0p1", "slurm_job_ids": "7", **measured},
            {"run": "cpu_lr0p9", "slurm_job_ids": "8", **measured},  # sacct forgot job 8
            {"run": "cpu", "slurm_job_ids": None, "status": "missing"}]
    with_accounting(rows, RECORDED)
    assert rows[0]["usage_from"] == "sacct"
    assert rows[0]["mem_used_mb"] == pytest.approx(166964 / 1024)
    assert (rows[0]["cpu_efficiency_measured"], rows[0]["mem_used_measured_mb"],
            rows[0]["runtime_used_measured_min"]) == (0.9, 180.0, 0.04)
    assert rows[1]["usage_from"] == "measured" and rows[1]["mem_used_mb"] == 180.0
    assert rows[2]["usage_from"] is None
    no_accounting = [{"run": "cpu_lr0p1", "slurm_job_ids": "7", **measured}]
    assert with_accounting(no_accounting, None)[0]["mem_used_mb"] == 180.0
    assert no_accounting[0]["usage_from"] == "measured"


def test_one_sacct_call_for_every_job_and_none_without_accounting(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    sacct = bin_dir / "sacct"
    (tmp_path / "answer").write_text(RECORDED)
    sacct.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n{shutil.which("cat")} {tmp_path}/answer\n')
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert slurm.job_accounting(["7", "5", "7", ""]) == RECORDED
    assert calls.read_text().splitlines() == [f"-P -n -j 5,7 -o {slurm.ACCOUNTING_FIELDS}"]
    assert slurm.job_accounting([]) is None
    sacct.write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2"
                     "\nexit 1\n")
    assert slurm.job_accounting(["5"]) is None


ONE_STEP = """\
9|test-pack|00:00:10|00:15.000|2||2000M|00:10:00|COMPLETED|
9.batch|batch|00:00:10|00:00.020|2|20000K|||COMPLETED|1
9.0|cpu-pack001|00:00:08|00:14.800|2|900M|||COMPLETED|2
"""


def test_members_of_one_step_count_its_largest_task_not_the_tasks_sum():
    """A CPU pack's members are the tasks of one step (job/pack_step.py): each member's
    memory is the step's largest task's (MaxRSS), not that times its 2 tasks (a ddp run
    alone in such a step sums its ranks); each counts the step's CPU time."""
    rows = [{"run": "cpu_a", "slurm_job_ids": "9"}, {"run": "cpu_b", "slurm_job_ids": "9"}]
    with_accounting(rows, ONE_STEP)
    assert [r["mem_used_mb"] for r in rows] == [900, 900]
    assert rows[0]["cpu_efficiency"] == pytest.approx(15.0 / (10 * 2))
    alone = [{"run": "ddp", "slurm_job_ids": "9"}]  # one run: its ranks' memory together
    assert with_accounting(alone, ONE_STEP)[0]["mem_used_mb"] == 1800
