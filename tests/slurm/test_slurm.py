"""End to end against a real Slurm (slurmctld + slurmd on this machine, started by
tests/slurm/cluster.sh): every segment and the environment record are sbatch jobs,
ddp ranks are started by srun, fetch/extract/aggregate stay on the login node."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from conftest import (ROOT, SLURM_RUNS, assert_bit_identical, cancel_slurm_jobs, cli, freeze,
                      slurm_job_prefix, slurm_jobs, snakemake, start_snakemake, state_of,
                      summary_rows, train_until_saved, training_spec, run_batches)
from alliance import CPU_ACCOUNT
from cifarflow.engine.checkpoints import files as ckpt
from cifarflow.slurm import fields

pytestmark = pytest.mark.slurm
CONFIG = ROOT / "tests" / "configs" / "slurm" / "config.yaml"
STRATEGIES = ("cpu", "ddp", "fsdp", "lightning")
FAST_POLLING = ["--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1", "--latency-wait", "5"]


SLURM_CLIENTS = ("sbatch", "srun", "squeue", "sacct", "sacctmgr", "scontrol", "sinfo", "scancel")


def logged_clients(tmp_path, names=SLURM_CLIENTS) -> tuple[str, Path]:
    """Stand-ins for Slurm's clients first on PATH: each call logged (when, the job it ran
    in or '-', the command line), then the real command. Returns that PATH and the log."""
    wrappers, log = tmp_path / "logged-bin", tmp_path / "slurm-calls.log"
    wrappers.mkdir()
    for name in names:
        (wrappers / name).write_text(
            f'#!/bin/sh\necho "$(date +%s.%N)|${{SLURM_JOB_ID:--}}|{name} $*" >> {log}\n'
            f'exec {shutil.which(name)} "$@"\n')
        (wrappers / name).chmod(0o755)
    return f"{wrappers}{os.pathsep}{os.environ['PATH']}", log


def logged_calls(log: Path) -> list[tuple[float, str, str]]:
    """(when, job or '-', command line) of each call logged_clients' stand-ins logged."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(float(when), job, call) for when, job, call in
            (line.split("|", 2) for line in lines)]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if out.returncode != 0 or not re.search(r"idle|mix|alloc", out.stdout):
        pytest.fail("no Slurm cluster: run `bash tests/slurm/cluster.sh start` (make test does)")


def profile_args(workdir) -> list:
    """--profile profiles/slurm, fast polling, and job names of this working directory's own
    (conftest.slurm_job_prefix): a test finds its jobs by them, and only its own."""
    return ["--profile", ROOT / "profiles" / "slurm", *FAST_POLLING,
            "--slurm-jobname-prefix", slurm_job_prefix(workdir)]


def slurm(workdir, *args, configfile=CONFIG, **kw):
    return snakemake(workdir, *profile_args(workdir), "--verbose", *args, configfile=configfile,
                     **kw)


def submitted(stdout: str) -> dict:
    """rule name -> SLURM job ids, from the plugin's own log lines."""
    jobs = {}
    for rule, jobid in re.findall(r"slurm_logs/rule_(\w+)/\S*?(\d+)\.log", stdout):
        jobs.setdefault(rule, []).append(jobid)
    return jobs


def job_state(jobid: str) -> str:
    return subprocess.run(["squeue", "-t", "all", "-h", f"-j{jobid}", "-o", "%T"],
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("slurm")
    out = slurm(work)
    text = out.stdout + out.stderr
    print("\n--- sbatch calls the plugin issued ---")
    for line in re.findall(r"^.*sbatch call: .*$", text, flags=re.M):
        print(line.strip())
    return work, text


def test_every_job_but_the_local_rules_ran_under_slurm(slurm_run):
    work, text = slurm_run
    jobs = submitted(text)
    assert set(jobs) == {"record_environment", *(f"train_{s}" for s in STRATEGIES)}, jobs
    for strategy in STRATEGIES:
        assert len(set(jobs[f"train_{strategy}"])) == 2  # each segment its own job
    for ids in jobs.values():
        for jobid in ids:
            assert job_state(jobid) == "COMPLETED", jobid
    for rule in ("fetch_dataset", "extract_dataset", "aggregate_results"):
        assert re.search(rf"localrule {rule}:", text), rule
    assert re.search(r"sbatch call: sbatch .*--ntasks-per-node=2", text)
    env = json.loads((work / "results/environment/environment.json").read_text())
    assert env["slurm"]["SLURM_JOB_ID"] in jobs["record_environment"]


def test_segments_and_ranks_record_their_slurm_jobs(slurm_run):
    work, text = slurm_run
    jobs = submitted(text)
    for run, rule in ((s, f"train_{s}") for s in STRATEGIES):
        manifests = [ckpt.read_manifest(work / f"results/runs/{run}/segment-{k}") for k in (1, 2)]
        ids = [m["slurm_job_id"] for m in manifests]
        assert sorted(ids) == sorted(jobs[rule]) and ids[0] != ids[1]
        history = [json.loads(l) for l in
                   (work / f"results/runs/{run}/segment-2/metrics.jsonl").read_text().splitlines()]
        assert [h["slurm_job_id"] for h in history] == ids  # epoch 1 in job 1, epoch 2 in job 2
    log = (work / "results/logs/train/ddp/segment-1.log").read_text()
    assert "[launch] srun --kill-on-bad-exit=1 --nodes=1 --ntasks=2" in log
    assert "world 2 via srun, backend gloo" in log
    # Lightning under srun: ranks from Slurm's environment, the engine's checkpoint
    log = (work / "results/logs/train/lightning/segment-2.log").read_text()
    assert "[launch] srun --kill-on-bad-exit=1 --nodes=1 --ntasks=2" in log
    assert "resumed from results/runs/lightning/segment-1 at epoch 2, batch 0" in log


def test_summary_is_complete(slurm_run):
    work, _ = slurm_run
    import csv

    rows = {r["run"]: r for r in csv.DictReader(open(work / "results/summary.csv"))}
    assert set(rows) == set(STRATEGIES)
    assert rows["cpu"]["world_size"] == "1"
    assert all(rows[s]["world_size"] == "2" for s in ("ddp", "fsdp", "lightning"))
    for r in rows.values():
        assert r["status"] == "ok" and r["epochs"] == "2" and float(r["test_acc"]) > 0.2
        assert len(r["slurm_job_ids"].split()) == 2


def running_jobs(workdir) -> dict[str, str]:
    """job id -> comment (rule_<rule>_wildcards_<wildcards>) of the running jobs of the
    workflow run in `workdir`."""
    return {j: comment for j, (_, comment) in slurm_jobs(slurm_job_prefix(workdir), "R").items()}


def train_job_id(workdir, comment: str) -> str | None:
    return next((j for j, c in running_jobs(workdir).items() if c == comment), None)


def start_slurm(workdir, *configfiles, args=()) -> subprocess.Popen:
    """snakemake --profile profiles/slurm in the background, output captured."""
    proc = start_snakemake(workdir, *profile_args(workdir), *args, configfile=list(configfiles))
    SLURM_RUNS.append(proc)  # killed after the test if it still runs (conftest.own_slurm_jobs)
    return proc


def start_long_segment(tmp_path, strategy="cpu", epochs=60, frozen=False, ranks=1):
    """A one-segment run through profiles/slurm (its config: tmp_path/long.yaml over
    CONFIG); returns once its job runs and has written an in-segment checkpoint:
    (snakemake process, job id). ``frozen``: its training (its ``ranks`` processes) is
    stopped (SIGSTOP) from the moment it is seen and let on in short steps until that
    checkpoint exists, so it is mid-segment however fast the machine trains: a few epochs
    are then enough (a short run could end otherwise)."""
    long_run = tmp_path / "long.yaml"
    long_run.write_text(f"strategies: [{strategy}]\nsegments: {{count: 1}}\ntrain: {{epochs: "
                        f"{epochs}, batch_size: 10, lr: 0.01, checkpoint_interval_s: 0.5}}\n")
    t0 = time.time()
    proc = start_slurm(tmp_path, CONFIG, long_run)
    work = tmp_path / f"results/runs/{strategy}/work"
    jobid, training = None, []
    while time.time() - t0 < 300 and not (len(training) == ranks if frozen else
                                          jobid and (work / "checkpoint.json").exists()):
        jobid = jobid or train_job_id(tmp_path, f"rule_train_{strategy}_wildcards_{strategy}_1")
        training = training_processes(jobid) if jobid and frozen else []
        time.sleep(0.05 if jobid else 1)
    if frozen:
        train_until_saved(training, work)
    assert jobid and (work / "checkpoint.json").exists(), "training job did not start"
    return proc, jobid


def job_processes(jobid: str) -> list[int]:
    """The processes Slurm runs for one job (its steps' tasks carry its SLURM_JOB_ID), on
    any of the test nodes: this job's own, never another training on the machine."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={jobid}".encode() in environ:
            found.append(int(proc.name))
    return found


def training_processes(jobid: str) -> list[int]:
    """The job's `cifarflow train` processes (its ranks, or a pack's members)."""
    return [pid for pid in job_processes(jobid) if training_spec(pid)]


def freeze_training(jobid: str, ranks: int = 1) -> None:
    """SIGSTOP the segment's training processes, found by their job: whatever Slurm does
    to the job next happens mid-segment, however fast this machine trains."""
    training = training_processes(jobid)
    assert len(training) == ranks, training
    freeze(training)  # SIGSTOP, and wait until /proc says each one stopped


def preempt_long_segment(tmp_path, strategy="cpu", ranks=1) -> str:
    """A long segment, frozen once it has an in-segment checkpoint, is preempted by a job
    of the urgent partition that needs the whole node (Slurm sends SIGCONT and SIGTERM to
    the segment's step, then grants GraceTime). Returns the segment's job id once both jobs
    completed and Snakemake ended well by itself."""
    proc, jobid = start_long_segment(tmp_path, strategy, epochs=4, frozen=True, ranks=ranks)
    urgent = preempt(tmp_path, jobid, ranks)
    output = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, output[-3000:]
    assert job_state(urgent) == "COMPLETED"
    return jobid


def test_job_killed_for_its_time_limit_is_retried_and_resumes(tmp_path):
    """Slurm, not the segment's own timer, ends the job: once an in-segment checkpoint
    exists the training process is frozen (SIGSTOP), so the job outlives the limit it then
    gets (30 s, cut from the rule's 10 min) however fast this machine trains. The profile's
    retries resubmit the segment, which resumes from the last in-segment checkpoint, and
    the workflow ends well by itself."""
    proc, jobid = start_long_segment(tmp_path, epochs=4, frozen=True)
    freeze_training(jobid)  # Slurm's SIGCONT/SIGTERM/SIGKILL at the limit still reach it
    saved = ckpt.read_manifest(tmp_path / "results/runs/cpu/work")  # frozen: the last save
    subprocess.run(["scontrol", "update", f"JobId={jobid}", "TimeLimit=0:30"], check=True)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, output[-3000:]
    assert job_state(jobid) == "TIMEOUT" and "TIMEOUT" in output
    logs = tmp_path / "results/logs/train/cpu"
    first = (logs / "segment-1.attempt1.log").read_text()
    assert "resumed from" not in first
    # Slurm's SIGCONT at the limit lets it train on until its SIGTERM lands; it stops at
    # the next batch and saves there: the retry resumes at exactly that batch, past the
    # save it was frozen at
    stopped = re.search(r"stopping at epoch (\d+) batch (\d+): signal SIGTERM", first)
    assert stopped, first[-2000:]
    assert (f"resumed from results/runs/cpu/work at epoch {stopped[1]}, batch {stopped[2]}\n"
            in (logs / "segment-1.attempt2.log").read_text())
    assert (int(stopped[1]) - 1, int(stopped[2])) >= (saved["epoch"], saved["step"])
    assert ckpt.read_manifest(tmp_path / "results/runs/cpu/segment-1")["done"]
    twin = tmp_path / "uninterrupted"  # the same spec trained in one go, outside Slurm
    cli("train", "--spec", tmp_path / "results/runs/cpu/spec.json", "--data",
        run_batches(tmp_path, "cpu"), "--out", twin, "--threads", 1,
        timeout=900)
    assert_bit_identical(state_of(twin)["model"],
                         state_of(tmp_path / "results/runs/cpu/segment-1")["model"])
    import csv

    row = next(csv.DictReader(open(tmp_path / "results/summary.csv")))
    assert (row["attempts"], row["status"]) == ("2", "ok")


def test_a_segment_reads_its_jobs_end_and_queue_wait_from_what_the_job_kept(tmp_path):
    """Slurm 22.05 sets no SLURM_JOB_END_TIME: the job (common.smk's keep_slurm_job_values)
    asks squeue for its end (start + limit) and its wait in the queue, once; a rank reads
    both from its environment and runs no Slurm command (here it has none on its PATH)."""
    out, job, rank = tmp_path / "facts.txt", tmp_path / "job.py", tmp_path / "rank.py"
    job.write_text("import subprocess, sys\n"
                   "from cifarflow.jobfacts import keep_slurm_job_values\n"
                   "keep_slurm_job_values()  # what common.smk does in every job\n"
                   "subprocess.run([sys.executable, sys.argv[1]], check=True)\n")
    rank.write_text("import os\n"
                    "os.environ['PATH'] = ''  # a Slurm query here would find no squeue: None\n"
                    "from cifarflow.engine.stop import slurm_end_time\n"
                    "from cifarflow.engine.usage import queue_wait_s\n"
                    "print(slurm_end_time(), queue_wait_s())\n")
    jobid = subprocess.run(
        ["sbatch", "--parsable", "-A", CPU_ACCOUNT, "--time=7", "--mem=1500", f"--output={out}", "--begin=now+2",
         f"--job-name={slurm_job_prefix(tmp_path)}_facts", "--wrap",
         f"PYTHONPATH={ROOT / 'scripts'} {sys.executable} {job} {rank}"],
        capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.time() + 120
    while job_state(jobid) not in ("COMPLETED", "FAILED") and time.time() < deadline:
        time.sleep(0.5)
    assert job_state(jobid) == "COMPLETED", out.read_text()
    show = fields(subprocess.run(["scontrol", "show", "job", jobid], capture_output=True,
                                 text=True, check=True).stdout)
    start, submit = (datetime.fromisoformat(show[k]).timestamp()
                     for k in ("StartTime", "SubmitTime"))
    end_time, queue_wait = map(float, out.read_text().split()[-2:])
    assert end_time == start + 7 * 60
    assert queue_wait == start - submit >= 2  # --begin=now+2 holds it 2 s at least


def test_unknown_partition_is_one_clear_error(tmp_path):
    """Refused by the plan, before sbatch would refuse it (invalid partition specified)."""
    out = slurm(tmp_path, "record_environment", config=["slurm={'partition': 'nosuchpart'}"],
                check=False)
    assert out.returncode != 0
    assert ("slurm.partition nosuchpart is not a partition of this cluster (cpubase_bycore_b1, "
            "cpubase_bycore_b3, gpubase_bygpu_b1, gpubase_bygpu_b3): unset slurm.partition (and "
            "$SLURM_PARTITION) so the site places each job, or name one of those"
            in out.stdout + out.stderr), (out.stdout + out.stderr)[-3000:]
    assert not slurm_jobs(slurm_job_prefix(tmp_path))  # nothing was submitted


def preempt(workdir, jobid: str, ranks: int = 1) -> str:
    """Freeze the job's training (by its job id), then preempt it with a job of the urgent
    partition that needs the whole node (named as the test's own jobs); returns its id."""
    freeze_training(jobid, ranks)
    cpus = subprocess.run(["sinfo", "-h", "-p", "urgent", "-o", "%c"], capture_output=True,
                          text=True).stdout.split()[0]
    return subprocess.run(["sbatch", "--parsable", "-A", CPU_ACCOUNT, "-p", "urgent",
                           f"--cpus-per-task={cpus}",
                           "--mem=500", "--output=/dev/null",
                           f"--job-name={slurm_job_prefix(workdir)}_urgent", "--wrap", "sleep 2"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.variant  # a preempted segment ends well, no retry spent: the ddp ranks' test
def test_a_segment_preempted_three_times_finishes_by_itself_within_two_retries(tmp_path):
    """A one-process segment is its own srun step, so on preemption Slurm signals that step
    (SIGCONT, SIGTERM, then GraceTime): the segment stops at the next batch, checkpoints and
    ends its job well (COMPLETED, no retry spent); the chain goes on with a new segment that
    resumes at that very batch. Three preemptions with the profile's `retries: 2`: the run
    finishes by itself. Each segment is frozen as soon as it is past its start-up (its
    begin line), and stays frozen until it is preempted, so this holds however fast the
    machine trains (10 epochs: room for the tenth of a second between the line and the
    freeze)."""
    run = tmp_path / "run.yaml"
    run.write_text("strategies: [cpu]\nsegments: {count: 1}\n"
                   "train: {epochs: 10, batch_size: 10, lr: 0.01}\n")
    proc = start_slurm(tmp_path, CONFIG, run)
    logs = tmp_path / "results/logs/train/cpu"
    jobs, urgent = [], []
    try:
        for k in (1, 2, 3):
            deadline, jobid = time.time() + 300, None
            log = logs / f"segment-{k}.attempt1.log"
            while time.time() < deadline and proc.poll() is None:
                jobid = jobid or train_job_id(tmp_path, f"rule_train_cpu_wildcards_cpu_{k}")
                if jobid and log.exists() and "[cpu] {" in log.read_text() \
                        and training_processes(jobid):
                    break
                time.sleep(0.1)
            assert jobid and proc.poll() is None, f"segment {k} did not start"
            freeze_training(jobid)  # preempt() freezes it again: a no-op
            while time.time() < deadline and any(  # the urgent job would preempt it too
                    comment == "rule_record_environment" and state != "COMPLETED" for state,
                    comment in slurm_jobs(slurm_job_prefix(tmp_path)).values()):
                time.sleep(0.2)
            jobs.append(jobid)
            urgent.append(preempt(tmp_path, jobid))
            while job_state(jobid) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") \
                    and time.time() < deadline + 300:
                time.sleep(0.5)
        output = proc.communicate(timeout=900)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert [job_state(j) for j in jobs + urgent] == ["COMPLETED"] * 6
    assert sorted(p.name for p in logs.glob("*.attempt*.log")) == [
        f"segment-{k}.attempt1.log" for k in (1, 2, 3, 4)]  # no retry, no requeue
    for k in (1, 2, 3):
        stop = re.search(r"stopping at epoch (\d+) batch (\d+): signal SIGTERM",
                         (logs / f"segment-{k}.attempt1.log").read_text())
        assert stop, k
        assert (f"resumed from results/runs/cpu/segment-{k} at epoch {stop[1]}, batch {stop[2]}\n"
                in (logs / f"segment-{k + 1}.attempt1.log").read_text())
    assert ckpt.read_manifest(tmp_path / "results/runs/cpu/segment-4")["done"]
    row = summary_rows(tmp_path)["cpu"]
    assert (row["status"], row["segments"], row["attempts"], row["early_stops"]) == \
        ("ok", "4", "4", "3")


def test_preempted_ddp_ranks_stop_together_and_the_chain_goes_on(tmp_path):
    """2 ddp ranks (their own srun step) are preempted: both stop at the same batch,
    checkpoint, and the job ends well within GraceTime; the next segment resumes there."""
    jobid = preempt_long_segment(tmp_path, "ddp", ranks=2)
    assert job_state(jobid) == "COMPLETED"  # no retry, no requeue: the job ended well
    logs = tmp_path / "results/logs/train/ddp"
    assert sorted(p.name for p in logs.glob("*.attempt*.log")) == [
        "segment-1.attempt1.log", "segment-2.attempt1.log"]
    stops = re.findall(r"\[rank (\d)\] stopping at epoch (\d+) batch (\d+): (signal \w+.*)",
                       (logs / "segment-1.attempt1.log").read_text())
    assert sorted(r for r, *_ in stops) == ["0", "1"], stops
    assert len({(e, b) for _, e, b, _ in stops}) == 1, stops  # the same batch on both ranks
    _, epoch, batch, _ = stops[0]
    assert "signal SIGTERM" in {why for *_, why in stops}
    assert (f"resumed from results/runs/ddp/segment-1 at epoch {epoch}, batch {batch}\n"
            in (logs / "segment-2.attempt1.log").read_text())




def test_ctrl_c_cancels_the_running_segment_and_stops(tmp_path):
    """Retries and requeue notwithstanding, Ctrl-C on Snakemake still stops the workflow:
    it cancels the running segment's job and exits, and nothing is resubmitted. The segment
    is frozen at its first in-segment save: it cannot end before the Ctrl-C however fast or
    loaded the machine, and it spends no CPU meanwhile."""
    proc, jobid = start_long_segment(tmp_path, epochs=4, frozen=True)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, output[-2000:]
    assert job_state(jobid) == "CANCELLED"
    # the controller, the only one that submits, has ended: what it submitted is all there
    # will be (a cancelled job is not requeued), so no wait can make this pass by accident
    jobs = slurm_jobs(slurm_job_prefix(tmp_path))
    assert len(jobs) == 2, jobs  # the environment record, this
    assert not any(state == "PENDING" for state, _ in jobs.values()), jobs


def retried_segments(workdir: Path) -> str:
    """Each segment that took a second try, with the end of its first try's log."""
    lines = []
    for second in sorted((workdir / "results/logs/train").glob("*/segment-*.attempt2.log")):
        first = second.with_name(second.name.replace("attempt2", "attempt1"))
        tail = first.read_text().splitlines()[-3:] if first.exists() else ["(no log)"]
        lines.append(f"{second.parent.name} {second.name}: " + " | ".join(tail))
    return "segments tried again:\n" + "\n".join(lines)


def test_pruned_runs_submit_no_further_jobs(tmp_path):
    """The pruning sweep through the profile, 4 of its runs: the better half goes on after
    segments 1 and 2, so 4 + 2 + 1 segment jobs, and no job for a pruned run's next
    segment."""
    four = tmp_path / "four.yaml"
    four.write_text("sweep: {lr: [0.1, 0.02, 0.00001, 50.0]}\n")  # two that cannot learn
    prune = ROOT / "tests" / "configs" / "prune" / "config.yaml"
    out = slurm(tmp_path, configfile=[prune, four])
    jobs = submitted(out.stdout + out.stderr)
    per_run = {}
    for line in re.findall(r"rule_train_cpu_wildcards_(\S+?)_(\d+)\b", out.stdout + out.stderr):
        per_run.setdefault(line[0], set()).add(int(line[1]))
    assert len(set(jobs["train_cpu"])) == 7, retried_segments(tmp_path)
    assert sorted(len(s) for s in per_run.values()) == [1, 1, 2, 3]
    import csv

    rows = {r["run"]: r for r in csv.DictReader(open(tmp_path / "results/summary.csv"))}
    for run, segments in per_run.items():
        assert rows[run]["segments"] == str(max(segments))
        assert rows[run]["status"] == ("ok" if max(segments) == 3 else "pruned")


def test_a_test_finds_only_its_own_jobs_and_its_leftovers_are_cancelled(tmp_path):
    """Two tests' jobs side by side, one frozen mid-run: each test sees only the jobs named
    after its own working directory, and cancelling one test's leftovers (what the
    own_slurm_jobs fixture does after every test) ends only those, the frozen one too."""
    other = tmp_path / "other"
    other.mkdir()

    def submit(workdir, script):
        return subprocess.run(["sbatch", "--parsable", "-A", CPU_ACCOUNT, "--mem=100", "--output=/dev/null",
                               f"--job-name={slurm_job_prefix(workdir)}_probe",
                               "--comment=rule_train_cpu_wildcards_cpu_1", "--wrap", script],
                              capture_output=True, text=True, check=True).stdout.strip()

    mine = submit(tmp_path, "kill -STOP $$")  # a job whose process is frozen
    theirs = submit(other, "sleep 300")
    deadline = time.time() + 60
    while time.time() < deadline and set(running_jobs(tmp_path)) | set(running_jobs(other)) \
            != {mine, theirs}:
        time.sleep(0.2)
    assert running_jobs(tmp_path) == {mine: "rule_train_cpu_wildcards_cpu_1"}
    assert train_job_id(other, "rule_train_cpu_wildcards_cpu_1") == theirs
    assert cancel_slurm_jobs([slurm_job_prefix(tmp_path)]) == [mine]
    assert (job_state(mine), job_state(theirs)) == ("CANCELLED", "RUNNING")
    assert cancel_slurm_jobs([slurm_job_prefix(other)]) == [theirs]
    assert job_state(theirs) == "CANCELLED"
