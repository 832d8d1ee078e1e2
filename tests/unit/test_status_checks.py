"""The fixes of Snakemake and its Slurm plugin (cifarflow/controller/snakemake_fixes.py) on
the real modules: the plugin's own status check (Executor.check_active_jobs, driven round by
round as the executor interface's _wait_for_jobs drives it) against stand-in sacct, squeue
and scontrol on PATH that fail, hang, then answer, or say a job was cancelled; and every
target a fix patches, checked present (a stand-in module without one fails naming it)."""

import asyncio
import importlib
import logging
import shutil
import sys
import time
import types
from types import SimpleNamespace

import pytest

import snakemake_executor_plugin_slurm as plugin
from snakemake.scheduling.job_scheduler import JobScheduler
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

from cifarflow import slurm
from cifarflow.controller import snakemake_fixes as fixes
from cifarflow.controller.ownership import Ownership
from cifarflow.job import snakemake_start
from cifarflow.results.table import was_cancelled
from cifarflow.slurm_queue import JobRecord


@pytest.fixture
def pristine(monkeypatch):
    """Every name a fix patches restored after the test (the fixes patch classes in place)."""
    for module, owner, name, _ in fixes.TARGETS:
        m = importlib.import_module(module)
        target = getattr(m, owner) if owner else m
        monkeypatch.setattr(target, name, getattr(target, name))
    monkeypatch.setattr(fixes, "NOT_RETRIED", set())
    monkeypatch.setattr(fixes, "LISTENERS", {})


@pytest.fixture
def slurm_bin(tmp_path, monkeypatch):
    """Stand-ins for sacct, squeue and scontrol whose answers a test sets (a file each: the
    lines they print, or "fail" / "hang"); each logs its argv."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    sleep, grep, cat = (shutil.which(c) for c in ("sleep", "grep", "cat"))
    bin_dir.mkdir()
    (bin_dir / "which").symlink_to(shutil.which("which"))  # the plugin's is_query_tool_available
    monkeypatch.setenv("PATH", str(bin_dir))
    slurm.forget()
    for name in ("sacct", "squeue", "scontrol"):
        answer = tmp_path / f"{name}.answer"
        (bin_dir / name).write_text(
            f'#!/bin/sh\necho "{name} $*" >> {calls}\n'
            f'if {grep} -qx fail {answer}; then echo "{name}: error: Problem talking to the '
            f'database: Connection refused" >&2; exit 1; fi\n'
            f'if {grep} -qx hang {answer}; then exec {sleep} 300; fi\n{cat} {answer}\n')
        (bin_dir / name).chmod(0o755)

    def answer(name: str, text: str) -> None:
        (tmp_path / f"{name}.answer").write_text(text + "\n")

    answer("scontrol", "MinJobAge = 300 sec")
    answer("squeue", "")
    answer.calls = lambda name: [c for c in (calls.read_text().splitlines()
                                             if calls.exists() else []) if c.startswith(name)]
    return answer


class Job:
    """A Snakemake job as the plugin and the scheduler see it."""

    def __init__(self, run: str, restart_times: int = 2):
        self.name, self.wildcards = "train_cpu", [run, "1"]
        self.wildcards_dict = {"run": run, "segment": "1"}
        self.restart_times, self.attempt, self.errors = restart_times, 1, []

    def log_error(self, msg=None, **kwargs):
        self.errors.append(msg)


class Scheduler:
    def __init__(self):
        self.done, self.failed = [], []

    def finish_callback(self, job):
        self.done.append(job)

    def error_callback(self, job):
        self.failed.append(job)


def executor(status_attempts: int = 5):
    """The real plugin Executor, without its __init__ (which starts threads and needs a whole
    workflow): what its check_active_jobs reads."""
    ex = object.__new__(plugin.Executor)
    settings = SimpleNamespace(status_attempts=status_attempts, status_command="sacct",
                               init_seconds_before_status_checks=40, requeue=False,
                               keep_successful_logs=True)
    ex.workflow = SimpleNamespace(executor_settings=settings, scheduler=Scheduler(),
                                  remote_execution_settings=SimpleNamespace(
                                      seconds_between_status_checks=10))
    ex.logger, ex.run_uuid = logging.getLogger("slurm-plugin"), "uuid-1"
    ex._next_seconds_between_status_checks = None
    ex._status_query_calls = ex._status_query_failures = 0
    ex._status_query_total_seconds, ex._status_query_max_seconds = 0.0, 0.0
    ex._status_query_min_seconds, ex._status_query_cycle_rows = None, []
    ex._preemption_warning, ex._failed_nodes = False, set()

    class NoLimit:
        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

    ex.status_rate_limiter = NoLimit()
    return ex


def status_round(ex, active: list) -> list:
    """One status check as the executor interface runs it: what is yielded stays active."""
    async def check():
        return [j async for j in ex.check_active_jobs(list(active))]
    return asyncio.run(check())


def jobs(*ids):
    return [SubmittedJobInfo(job=Job(f"r{i}"), external_jobid=str(i), aux={}) for i in ids]


def sacct_states(**states) -> str:
    return "\n".join(f"{job.lstrip('j')}|{state}" for job, state in states.items())


def with_fix(said, cancelled=None):
    fixes.keep_restarted_jobs_ready()
    fixes.notice_outages_and_cancellations(
        said.append, lambda *a: (cancelled if cancelled is not None else []).append(a))


# ---- the plugin alone: the bugs the fix answers (the day these fail, the fix can go) ----
def test_the_plugin_alone_drops_every_job_when_sacct_does_not_answer(pristine, slurm_bin):
    ex, active = executor(), jobs(1, 2)
    slurm_bin("sacct", "fail")
    assert status_round(ex, active) == []  # neither reported nor kept: waited on forever
    assert ex.workflow.scheduler.done == ex.workflow.scheduler.failed == []
    assert len(slurm_bin.calls("sacct")) == 5  # status_attempts, at once


def test_the_plugin_alone_waits_forever_on_a_job_cancelled_with_scancel(pristine, slurm_bin):
    ex, active = executor(), jobs(1, 2)
    slurm_bin("sacct", sacct_states(j1="COMPLETED", j2="CANCELLED by 0"))
    for _ in range(3):
        active = status_round(ex, active)
        assert [j.external_jobid for j in active] == ["2"]  # "still running?"
    assert ex.workflow.scheduler.failed == []


# ---- with the fix -------------------------------------------------------------------
def test_an_accounting_outage_keeps_the_jobs_says_so_once_and_goes_on(pristine, slurm_bin):
    said = []
    with_fix(said)
    ex, active = executor(), jobs(1, 2, 3)
    slurm_bin("sacct", sacct_states(j1="RUNNING", j2="PENDING", j3="RUNNING"))
    active = status_round(ex, active)
    assert len(active) == 3 and said == []
    slurm_bin("sacct", "fail")  # slurmdbd stopped; slurmctld still knows job 1 ended
    slurm_bin("squeue", "1|COMPLETED\n2|PENDING\n3|RUNNING")
    active = status_round(ex, active)
    assert [j.external_jobid for j in active] == ["2", "3"]
    assert ex.workflow.scheduler.done == [ex.workflow.scheduler.done[0]]
    assert ex.workflow.scheduler.failed == []  # no try counted failed for lack of an answer
    assert len(said) == 1 and "accounting" in said[0] and "does not answer" in said[0]
    slurm_bin("squeue", "fail")  # slurmctld restarting too
    for _ in range(2):
        active = status_round(ex, active)
    assert len(active) == 2 and ex.workflow.scheduler.failed == []
    assert len(said) == 2 and "squeue does not answer" in said[1]
    sacct_before = len(slurm_bin.calls("sacct"))
    slurm_bin("sacct", sacct_states(j1="COMPLETED", j2="COMPLETED", j3="COMPLETED"))
    assert status_round(ex, active) == []
    assert len(ex.workflow.scheduler.done) == 3 and ex.workflow.scheduler.failed == []
    assert len(said) == 3 and "answers again" in said[2]
    assert len(slurm_bin.calls("sacct")) == sacct_before + 1
    # one failed question per check, not status_attempts of them: 1 + 1 + 2 + 1
    assert len(slurm_bin.calls("sacct")) == 5


def test_a_hung_sacct_holds_one_check_for_one_timeout_not_five(pristine, slurm_bin,
                                                               monkeypatch):
    wait_for = asyncio.wait_for
    monkeypatch.setattr(asyncio, "wait_for", lambda aw, timeout: wait_for(aw, 1))  # not 60 s
    with_fix([])
    ex, active = executor(), jobs(1)
    slurm_bin("sacct", "hang")
    slurm_bin("squeue", "1|RUNNING")
    t0 = time.monotonic()
    assert len(status_round(ex, active)) == 1
    assert time.monotonic() - t0 < 4 and len(slurm_bin.calls("sacct")) == 1


def test_a_job_cancelled_from_outside_fails_at_the_next_check_named_and_not_retried(
        pristine, slurm_bin):
    said, cancelled = [], []
    with_fix(said, cancelled)
    ex, active = executor(), jobs(1, 2, 3)
    slurm_bin("sacct", sacct_states(j1="COMPLETED", j2="CANCELLED by 0", j3="RUNNING"))
    active = status_round(ex, active)
    assert [j.external_jobid for j in active] == ["3"]
    job = ex.workflow.scheduler.failed[0]
    assert ex.workflow.scheduler.failed == [job] and job.wildcards_dict["run"] == "r2"
    assert len(job.errors) == 1
    assert job.errors[0].startswith("Slurm job 2 (train_cpu_wildcards_r2_1) was cancelled by "
                                    "root (uid 0), not by this workflow: its run is reported "
                                    "cancelled and not retried")
    assert cancelled == [("2", "train_cpu_wildcards_r2_1", "root (uid 0)",
                          {"run": "r2", "segment": "1"})]
    assert not any("sacct -j 2." in c for c in slurm_bin.calls("sacct"))  # no 10 step asks
    # Snakemake's error handling: a fault is retried, the cancelled job fails for good
    fault = Job("r3")
    for one, restarted in ((fault, True), (job, False)):
        scheduler = fake_scheduler(one)
        JobScheduler._handle_error(scheduler, one)
        assert (one in scheduler.workflow.dag._ready_jobs) == restarted
        assert (one in scheduler.failed) != restarted


def test_a_job_squeue_lists_cancelled_during_an_outage_is_named_too(pristine, slurm_bin):
    cancelled = []
    with_fix([], cancelled)
    ex = executor()
    slurm_bin("sacct", "fail")
    slurm_bin("squeue", "4|CANCELLED")
    assert status_round(ex, jobs(4)) == []
    assert cancelled == [("4", "train_cpu_wildcards_r4_1",
                          "someone (Slurm does not say who)", {"run": "r4", "segment": "1"})]


def fake_scheduler(job):
    """What JobScheduler._handle_error touches, for a job that is running."""
    dag = SimpleNamespace(_ready_jobs=set(), _running={job}, jobid=lambda job: 1)
    return SimpleNamespace(
        workflow=SimpleNamespace(dryrun=True, dag=dag), running={job}, failed=set(),
        _errors=False, _free_resources=lambda job: None,
        get_executor=lambda job: SimpleNamespace(handle_job_error=lambda job: None))


def test_a_cancelled_run_is_recorded_and_its_summary_row_says_cancelled(tmp_path):
    owner = Ownership(str(tmp_path), "1.1", str(tmp_path), {})
    owner.job_cancelled("42", "train_cpu_wildcards_r2_1", "root (uid 0)", ["r2"])
    owner.job_cancelled("43", "train_pack_wildcards_p0_1", "uid 1000", [])
    owner.job_cancelled("44", "train_cpu_wildcards_cpu-pack002_1", "uid 1000", ["m2", "m3"])
    cancelled = JobRecord(str(tmp_path)).cancelled()
    assert set(cancelled) == {"42", "43", "44"} and cancelled["42"]["by"] == "root (uid 0)"
    assert was_cancelled("r2", {}, cancelled)
    # a pack cancelled before it started: its members have no try, the record names them
    assert was_cancelled("m2", {}, cancelled) and was_cancelled("m3", {}, cancelled)
    member = tmp_path / "runs" / "m1"
    (member / "segment-1").mkdir(parents=True)
    (member / "tries.jsonl").write_text('{"segment": 1, "attempt": 1, "event": "start", '
                                        '"job_id": "43", "invocation": "1.1"}\n')
    assert was_cancelled("m1", {"metrics": str(member / "segment-1" / "metrics.jsonl")},
                         cancelled)  # a pack's member: its try ran in the cancelled job
    assert not was_cancelled("r9", {}, cancelled)


# ---- fixes that cannot fail silently --------------------------------------------------
@pytest.mark.parametrize("target", fixes.TARGETS, ids=lambda t: f"{t[0]}:{t[1]}.{t[2]}")
def test_every_target_a_fix_patches_is_in_the_installed_release(target):
    module, owner, name, package = target
    m = importlib.import_module(module)
    assert fixes.patched(getattr(m, owner) if owner else m, name, package) is not None


def test_every_fix_applies_to_the_installed_release(pristine, slurm_bin):
    fixes.keep_restarted_jobs_ready()
    fixes.ask_the_scheduler_once()
    fixes.start_jobs_quietly()
    fixes.let_the_site_route()
    fixes.tell_when_locked(print)
    fixes.tell_each_submission(print)
    fixes.notice_outages_and_cancellations(print, print)
    assert plugin.Executor.check_active_jobs.cifarflow_fix


def test_a_fix_whose_target_is_renamed_fails_naming_it(pristine, monkeypatch):
    from importlib.metadata import version

    class Executor:  # a release where check_active_jobs is called otherwise
        def report_job_success(self, job_info): ...

    stand_in = types.SimpleNamespace(Executor=Executor, query_job_status=None)
    monkeypatch.setitem(sys.modules, "snakemake_executor_plugin_slurm", stand_in)
    with pytest.raises(RuntimeError, match=(
            rf"^cifarflow cannot apply its fix to snakemake-executor-plugin-slurm "
            rf"{version('snakemake-executor-plugin-slurm')}: Executor\.check_active_jobs is "
            r"not there\. Install the release constraints\.txt pins")):
        fixes.notice_outages_and_cancellations(print, print)
    for fix in (fixes.ask_the_scheduler_once, fixes.let_the_site_route):
        with pytest.raises(RuntimeError, match="is not there"):
            fix()


def test_a_jobs_start_fails_naming_the_plugin_module_it_no_longer_finds(tmp_path, monkeypatch):
    package = tmp_path / "snakemake_executor_plugin_slurm"
    package.mkdir()  # a release without job_status_query.py
    stand_in = types.ModuleType(snakemake_start.PLUGIN)
    stand_in.__spec__ = importlib.machinery.ModuleSpec(snakemake_start.PLUGIN, None,
                                                       is_package=True)
    stand_in.__spec__.submodule_search_locations = [str(package)]
    monkeypatch.setitem(sys.modules, snakemake_start.PLUGIN, stand_in)
    monkeypatch.delitem(sys.modules, snakemake_start.ASKING_MODULE, raising=False)
    with pytest.raises(RuntimeError, match=r"snakemake-executor-plugin-slurm [\d.]+: "
                                           r"snakemake_executor_plugin_slurm\.job_status_query "
                                           "is not there"):
        snakemake_start.answer_min_job_age_unknown()
    (package / "job_status_query.py").write_text("def min_job_age():\n    return 1\n")
    with pytest.raises(RuntimeError, match=r"job_status_query\.get_min_job_age is not there"):
        snakemake_start.answer_min_job_age_unknown()
    with pytest.raises(RuntimeError, match=r"\.Executor\.get_python_executable is not there"):
        snakemake_start.start_through_this_file(type("Executor", (), {}))
    monkeypatch.delitem(sys.modules, snakemake_start.REPORT_MODULE, raising=False)
    with pytest.raises(RuntimeError, match=r"slurm\.efficiency_report is not there"):
        snakemake_start.efficiency_report_on_first_use()
    (package / "efficiency_report.py").write_text(
        "def create_efficiency_report(n):\n    return n + 1\n")
    assert snakemake_start.efficiency_report_on_first_use()  # a stand-in until first used
    stand_in = sys.modules[snakemake_start.REPORT_MODULE]
    assert stand_in.create_efficiency_report(1) == 2  # the release's own function ran
    assert sys.modules[snakemake_start.REPORT_MODULE] is not stand_in
    assert not snakemake_start.efficiency_report_on_first_use()  # loaded: nothing to change


def test_constraints_pin_every_package_a_fix_touches():
    from conftest import ROOT

    pinned = {line.split("==")[0].strip().lower() for line in
              (ROOT / "constraints.txt").read_text().splitlines() if "==" in line}
    assert {t[3] for t in fixes.TARGETS} <= pinned
