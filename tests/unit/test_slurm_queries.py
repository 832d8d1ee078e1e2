"""Every Slurm query through one module: the command lines it runs, what it reads from
their answers, and its one error policy (a missing command, a failure, a timeout: a typed
reply, never an exception or a hang). Slurm's clients are stood in for by executables on
PATH that print what Slurm prints (tests/slurm asks the real ones)."""

import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest

from cifarflow.controller import limits

from cifarflow import slurm

from cifarflow.job import takeover

from cifarflow.job import tries
from cifarflow.job.launch import launch_argv

SLEEP = shutil.which("sleep")


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A PATH of stand-ins only (no real Slurm client reachable); each logs its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    slurm.forget()  # the plan's reads are cached per process
    calls = tmp_path / "calls"

    def add(name: str, body: str) -> None:
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{body}\n')
        path.chmod(0o755)

    add.calls = lambda: calls.read_text().splitlines() if calls.exists() else []
    return add


def test_a_missing_command_is_a_reply_not_an_error(fake_bin):
    reply = slurm.ask(["squeue", "-h"])
    assert (reply.status, reply.ok, reply.stdout) == ("missing", False, "")
    assert reply.detail.startswith("squeue: ")
    assert slurm.job_alive("12") is None and slurm.job_state("12") is None
    assert slurm.job_end_time("12") is None and slurm.cluster_config() is None
    assert limits.read_limits() is None  # the plan says: no answer from Slurm here


def test_a_failed_command_gives_its_status_and_last_error_line(fake_bin):
    fake_bin("squeue", 'echo "partial"; echo "warning" >&2; '
                       'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1')
    reply = slurm.ask(["squeue", "-h", "-j", "99"])
    assert reply.status == "failed" and reply.stdout == ""  # output counts only when ok
    assert reply.detail == ("squeue: exit status 1: slurm_load_jobs error: Invalid job id "
                            "specified")
    assert slurm.job_alive("99") is False  # the controller forgot it: ended long ago


def test_a_hung_command_is_killed_with_all_it_started(fake_bin, tmp_path):
    pid_file = tmp_path / "child.pid"
    fake_bin("scontrol", f"{SLEEP} 300 &\necho $! > {pid_file}\nwait")
    t0 = time.monotonic()
    reply = slurm.ask(["scontrol", "show", "config"], timeout_s=1)
    assert reply.status == "timeout" and reply.detail == "scontrol: no answer within 1 s"
    assert time.monotonic() - t0 < 60  # killed, not waited for (its child sleeps 300 s)
    child = int(pid_file.read_text())
    for _ in range(100):  # the orphan is reaped by init: gone or a zombie
        stat = Path(f"/proc/{child}/stat")
        if not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the hung command's child {child} still runs")


def test_the_default_timeout_applies_to_every_query(fake_bin, monkeypatch):
    fake_bin("squeue", f"exec {SLEEP} 300")
    monkeypatch.setattr(slurm, "TIMEOUT_S", 0.5)
    assert slurm.job_alive("12") is None  # unknown, so a take-over assumes it alive
    assert takeover.alive({"job_id": "12"}) is True


def test_job_queries_run_one_command_line_each(fake_bin):
    fake_bin("squeue", 'case "$*" in\n'
                       '  *--states=all*) echo "12|CANCELLED";;\n'
                       '  *%T*) echo RUNNING;;\n'
                       'esac')
    # scontrol's record of a running job, as 22.05 prints it (trimmed)
    fake_bin("scontrol", 'echo "JobId=12 JobName=x\n   JobState=RUNNING Reason=None\n'
                         '   SubmitTime=2031-05-04T10:00:00 EligibleTime=2031-05-04T10:00:00\n'
                         '   StartTime=2031-05-04T10:01:15 EndTime=2031-05-04T10:20:30\n'
                         '   NumNodes=1 NumCPUs=4 NumTasks=4 CPUs/Task=1"')
    fake_bin("scancel", "")
    assert slurm.job_times("12") == (datetime(2031, 5, 4, 10, 20, 30).timestamp(), 75.0)
    assert slurm.job_alive("12") is True
    assert slurm.job_state("12") == "CANCELLED"  # no sacct here: squeue --states=all
    assert slurm.job_tasks("12") == 4
    assert slurm.cancel("12").ok
    assert fake_bin.calls() == [
        "scontrol show job 12", "squeue -h -j 12 -o %T",
        "squeue --states=all -h -j 12 -o %A|%T", "scontrol show job 12", "scancel 12"]


def test_callers_read_slurm_through_the_module(fake_bin, monkeypatch, tmp_path):
    fake_bin("sacct", 'echo "7|OUT_OF_MEMORY+"')
    # a pending job has no start yet
    fake_bin("scontrol", 'echo "JobId=7 JobState=PENDING StartTime=Unknown EndTime=Unknown '
                         'SubmitTime=2031-05-04T10:00:00 NumTasks=4"')
    assert slurm.job_queue_wait_s("7") is None
    monkeypatch.delenv(tries.INVOCATION, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    tries.record(tmp_path, 1, 1, "start")  # killed: no end; sacct says why
    assert [t["ended"] for t in tries.tries_of(tmp_path, 1)] == [tries.OUT_OF_MEMORY]
    with pytest.raises(SystemExit, match="has 4 tasks but the run needs 2"):
        launch_argv(2, ["true"], environ={"SLURM_JOB_ID": "7"})


def test_job_state_prefers_accounting_and_drops_its_suffixes(fake_bin):
    fake_bin("sacct", 'echo "5|CANCELLED by 0"')
    fake_bin("squeue", "echo 5 RUNNING")
    assert slurm.job_state("5") == "CANCELLED"
    assert fake_bin.calls() == ["sacct -X -P -n -j 5 -o JobIDRaw,State"]


def test_the_states_of_many_jobs_are_one_question(fake_bin):
    """sacct once for all; squeue once, for the jobs sacct does not name (all of them where
    there is no accounting); a job neither knows is left out."""
    fake_bin("sacct", 'echo "7|OUT_OF_MEMORY"; echo "8|CANCELLED by 0"')
    fake_bin("squeue", 'echo "9|TIMEOUT"; echo "10|FAILED"')
    assert slurm.job_states(["9", "8", "7", "11", "8", ""]) == {
        "7": "OUT_OF_MEMORY", "8": "CANCELLED", "9": "TIMEOUT"}  # 10: not asked for
    assert fake_bin.calls() == ["sacct -X -P -n -j 11,7,8,9 -o JobIDRaw,State",
                                "squeue --states=all -h -j 11,9 -o %A|%T"]
    assert slurm.job_states([]) == {} and len(fake_bin.calls()) == 2  # nothing to ask


def test_read_limits_asks_scontrol_and_sacctmgr_once_a_process(fake_bin, monkeypatch):
    fake_bin("scontrol", 'case "$*" in\n'
                         '  "show config") printf "MaxJobCount             = 10000\\n'
                         'MaxArraySize            = 1001\\n'
                         'AccountingStorageType   = accounting_storage/slurmdbd\\n";;\n'
                         'esac')
    # the user's association: MaxSubmit 250, QOS normal (100 a user); a QOS it is not in: 5
    fake_bin("sacctmgr", 'case "$*" in *"show qos"*) printf "normal|100\\nother|5\\n";; '
                         '*MaxSubmit*) echo "250|normal";; '
                         '*Account*) printf "root\\ndef-cifar_cpu\\ndef-cifar_gpu\\nroot\\n";; esac')
    monkeypatch.setenv("USER", "alice")
    assert limits.read_limits() == {
        "max_job_count": "10000", "max_array_size": "1001", "accounting": True,
        "max_submit": 100}
    assert "sacctmgr -n -P show assoc where user=alice format=MaxSubmit,QOS" in fake_bin.calls()
    assert slurm.user_accounts("alice") == ("root", "def-cifar_cpu", "def-cifar_gpu")
    asked = len(fake_bin.calls())
    limits.read_limits(), slurm.user_accounts("alice"), slurm.records("partition")
    slurm.records("partition")
    assert len(fake_bin.calls()) == asked + 1  # only the first partition listing is new
    slurm.forget()
    limits.read_limits()
    assert len(fake_bin.calls()) == asked + 1 + 3  # asked again once forgotten


def test_without_accounting_the_accounts_are_unknown(fake_bin):
    fake_bin("sacctmgr", 'echo "sacctmgr: error: Problem talking to the database" >&2; exit 1')
    assert slurm.user_accounts("alice") is None


def test_first_host_expands_through_scontrol_else_parses(fake_bin):
    from cifarflow.engine.strategies.ddp import first_host

    assert first_host("cn[0012-0014,0020],gpu7") == "cn0012"  # no scontrol: parsed
    fake_bin("scontrol", "echo node-a; echo node-b")
    assert first_host("whatever") == "node-a"
