"""What the workflow asks the real controller, counted: the states of a results tree's
killed tries in one question (sacct, which answers on this cluster with accounting; squeue only for what it does not name), and a
job held by a maintenance reservation named as waiting for it, not as never starting.
Slurm's clients are the real ones, behind a wrapper first on PATH that counts each call."""

import csv
import getpass
import json
import subprocess
import time
from pathlib import Path

import pytest

from cifarflow import slurm

from cifarflow.job import tries
from cifarflow.results.aggregate import aggregate
from cifarflow.controller.pending import PendingWatch
from cifarflow.slurm_queue import pending_of, squeue_mine
from alliance import CPU_ACCOUNT
from conftest import slurm_job_prefix
from test_slurm import logged_calls, logged_clients

pytestmark = pytest.mark.slurm


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """sacct and squeue first on PATH: each call logged, then the real command. Returns a
    function giving the logged calls, clearing the log."""
    path, log = logged_clients(tmp_path, ("sacct", "squeue"))
    monkeypatch.setenv("PATH", path)

    def calls() -> list[str]:
        made = [call for _, _, call in logged_calls(log)]
        log.write_text("")
        return made

    return calls


def sbatch(workdir, *args) -> str:
    """A job named after the test's folder (the cleanup fixture cancels what is left)."""
    return subprocess.run(["sbatch", "--parsable", "-A", CPU_ACCOUNT, "-c", "1", "--mem", "50",
                           "-o", "/dev/null", "-J", f"{slurm_job_prefix(workdir)}_probe", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def state(job: str) -> str:
    return subprocess.run(["squeue", "-t", "all", "-h", f"-j{job}", "-o", "%T"],
                          capture_output=True, text=True).stdout.strip()


def wait_for(job: str, states, timeout_s=300) -> str:
    deadline = time.time() + timeout_s
    while state(job) not in states and time.time() < deadline:
        time.sleep(0.5)
    return state(job)


def write_run(results: Path, name: str, tried: list[tuple]) -> dict:
    """A finished one-epoch run whose tries.jsonl holds `tried`: (segment, job id, end or
    None: killed, no end written)."""
    run_dir = results / "runs" / name
    seg = run_dir / "segment-1"
    seg.mkdir(parents=True)
    (seg / "metrics.jsonl").write_text(json.dumps({
        "epoch": 1, "train_loss": 2.0, "test_acc": 0.3, "images_per_sec": 100.0,
        "wall_s": 1.0, "peak_mem_mb": 10.0}) + "\n")
    (seg / "checkpoint.json").write_text("{}")
    with open(run_dir / tries.TRIES, "w") as f:
        for attempt, (segment, job, end) in enumerate(tried, 1):
            f.write(json.dumps({"segment": segment, "attempt": attempt, "event": "start",
                                "job_id": job, "invocation": "1000.1"}) + "\n")
            if end:
                f.write(json.dumps({"segment": segment, "attempt": attempt, "event": "end",
                                    "job_id": job, "invocation": "1000.1", "ended": end}) + "\n")
    return {"strategy": "cpu", "resources": {"cpus_per_task": 1}, "segments": 1,
            "spec": {"device": "cpu", "model": "lenet", "batch_size": 100, "epochs": 1},
            "metrics": str(seg / "metrics.jsonl"), "logs": str(results / "logs" / name)}


def test_a_results_trees_killed_tries_are_one_question(tmp_path, counted):
    """Three runs, three tries without an end (a failed job, a cancelled one, one still
    pending), one that ended well: the summary asks sacct once and squeue once for the
    three (before: a sacct and a squeue for each), and each try ends as its job did."""
    failed, done = sbatch(tmp_path, "--wrap", "false"), sbatch(tmp_path, "--wrap", "true")
    cancelled = sbatch(tmp_path, "--hold", "--wrap", "true")
    held = sbatch(tmp_path, "--hold", "--wrap", "true")
    try:
        subprocess.run(["scancel", cancelled], check=True)
        assert wait_for(failed, ("FAILED",)) == "FAILED"
        assert wait_for(done, ("COMPLETED",)) == "COMPLETED"
        assert wait_for(cancelled, ("CANCELLED",)) == "CANCELLED"
        results = tmp_path / "results"
        runs = {"a": write_run(results, "a", [(1, failed, None)]),
                "b": write_run(results, "b", [(1, cancelled, None)]),
                "c": write_run(results, "c", [(1, done, "completed"), (2, held, None)])}
        counted()
        aggregate(runs, results, results / "plots", keep_missing=True)
        calls = counted()
        jobs = ",".join(sorted([failed, cancelled, held]))
        # one sacct for the three; squeue once, only for those sacct did not name yet (a job
        # submitted a moment ago may not have reached the accounting database)
        assert calls[0] == f"sacct -X -P -n -j {jobs} -o JobIDRaw,State", calls
        assert len(calls) <= 2 and all(c.startswith("squeue --states=all -h -j ") and
                                       c.endswith(" -o %A|%T") for c in calls[1:]), calls
        with open(results / "summary.csv") as f:
            rows = {r["run"]: r for r in csv.DictReader(f)}
        assert {run: rows[run]["try_ends"] for run in rows} == {
            "a": "killed 1", "b": "cancelled 1", "c": "completed 1, killed 1"}
        assert slurm.job_states([failed, cancelled, held, done]) == {
            failed: "FAILED", cancelled: "CANCELLED", held: "PENDING", done: "COMPLETED"}
    finally:
        subprocess.run(["scancel", held])


def test_a_job_held_by_a_maintenance_reservation_is_not_named_as_never_starting(tmp_path):
    """A MAINT reservation on n1 from now on, a job of this workflow asking n1: Slurm keeps
    it pending for ReqNodeNotAvail; the pending watch names it as waiting for the
    reservation, with the reservation's end, and without scancel advice."""
    name = f"cifarflow-test-{tmp_path.name}"[:60]
    subprocess.run(["scontrol", "create", "reservation", f"reservationname={name}",
                    "starttime=now", "duration=30", "nodes=n1", "flags=maint,ignore_jobs",
                    f"users={getpass.getuser()}"], check=True, capture_output=True)
    job = None
    try:
        job = subprocess.run(
            ["sbatch", "--parsable", "-A", CPU_ACCOUNT, "-p", "multi", "-w", "n1", "--mem", "50", "-D", str(tmp_path),
             "-J", f"{slurm_job_prefix(tmp_path)}_maint",
             "--comment", "rule_train_cpu_wildcards_cpu_1", "--wrap", "true"],
            capture_output=True, text=True, check=True).stdout.strip()
        deadline, reason = time.time() + 120, ""
        while not reason.startswith("ReqNodeNotAvail") and time.time() < deadline:
            time.sleep(0.5)
            found = pending_of(squeue_mine(), {job})
            reason = found[0]["reason"] if found else ""
        assert reason.startswith("ReqNodeNotAvail"), reason
        [end] = [r["EndTime"] for r in slurm.reservations() if r["ReservationName"] == name]
        said = []
        PendingWatch({job}, said.append).poll()  # a job this controller submitted
        assert said == [f"Slurm job {job} (train_cpu_wildcards_cpu_1) is pending for {reason} "
                        f"in partition multi: it waits for the maintenance reservation {name} "
                        f"on n1 until {end}, and starts by itself when the maintenance ends"]
        assert state(job) == "PENDING"
    finally:
        if job:
            subprocess.run(["scancel", job])
        subprocess.run(["scontrol", "delete", f"reservation={name}"], capture_output=True)
