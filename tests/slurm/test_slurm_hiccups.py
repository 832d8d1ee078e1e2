"""The site's hiccups cost nothing (issue 55), through profiles/slurm as a user types it:

- a job of the sweep cancelled with `scancel` from outside is named at the next status
  check (its id, rule, who cancelled), not retried, and the workflow ends without waiting
  for it (it waited forever: the plugin took `CANCELLED by 0` for a running job);
- slurmdbd stopped in the middle of a 2-segment sweep (an accounting outage, these tests
  change the whole cluster: the Slurm tests run one at a time) and started again: the
  controller says once that accounting does not answer and once that it answers again, and
  the sweep ends with every row ok and no extra try (it stopped submitting for good);
- slurmctld stopped in the middle of a sweep and started again with its saved state (a
  restart for maintenance): every row ok, no extra try;
- the user's submit limit (MaxSubmitJobs 4, set on the association for this test) half
  filled by two held jobs of the user's own from elsewhere: a 12-run sweep waits for room,
  two jobs at a time, saying so once, and ends with every row ok, no extra try, the held
  jobs untouched (its sbatch refusals were failed tries, retried into the same refusal, and
  the workflow exited 1);
- through the outage, no status check is skipped: a stand-in sacct first on the
  controller's PATH logs each call (then runs the real one), and no two of the plugin's
  status queries are further apart than its longest interval (they stopped for good)."""

import os
import re
import signal
import subprocess
import time

import pytest

from conftest import (ROOT, SLURM_RUNS, self_stopped, slurm_job_prefix, slurm_jobs,
                      start_snakemake, stop_at, summary_rows, sweep_config)
from alliance import CPU_ACCOUNT
from test_slurm import logged_calls, logged_clients, profile_args

pytestmark = pytest.mark.slurm
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"


def start(tmp_path, config, *args, **env):
    proc = start_snakemake(tmp_path, *profile_args(tmp_path), *args, configfile=[config],
                           env=env)
    SLURM_RUNS.append(proc)
    return proc


def running_train_job(prefix: str, pid: int) -> str:
    """The Slurm job of the training process ``pid`` (its SLURM_JOB_ID)."""
    environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    ids = [e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"SLURM_JOB_ID=")]
    assert ids and ids[0] in slurm_jobs(prefix), (ids, slurm_jobs(prefix))
    return ids[0]


def test_a_job_cancelled_from_outside_is_named_and_not_waited_for(tmp_path):
    config = sweep_config(tmp_path / "sweep.yaml", runs=2, runs_per_job=1)
    marker = tmp_path / "stopped.pid"
    proc = start(tmp_path, config, **stop_at("before-first-batch", "segment-1", marker))
    frozen = self_stopped(marker, proc)
    job = running_train_job(slurm_job_prefix(tmp_path), frozen)
    subprocess.run(["scancel", job], check=True)
    out = proc.communicate(timeout=600)[0]  # it ends: no wait on the cancelled job
    assert proc.returncode != 0, out[-3000:]
    assert re.search(rf"Slurm job {job} \(train_cpu_wildcards_\S+_1\) was cancelled by root "
                     r"\(uid 0\), not by this workflow: its run is reported cancelled and not "
                     r"retried", out), out[-4000:]
    assert not list((tmp_path / "results/logs/train").glob("*/segment-1.attempt2.log"))


@pytest.fixture
def accounting_outage():
    """Stops slurmdbd when called; starts the cluster's daemons again after the test."""
    def stop():
        subprocess.run(["bash", CLUSTER, "stop-accounting"], check=True, capture_output=True)

    yield stop
    subprocess.run(["bash", CLUSTER, "start"], check=True, capture_output=True)


# the plugin's longest wait between two status checks of active jobs (its max_sleep_time:
# each check that sees no job end waits 10 s longer, up to this), and sacct's own timeout
PLUGIN_LONGEST_INTERVAL_S, SACCT_TIMEOUT_S = 180, 60


def status_queries(log) -> list[float]:
    """When the plugin asked sacct for the state of the workflow's jobs."""
    return [when for when, _, call in logged_calls(log) if "--format=JobIdRaw,State" in call]


def test_an_accounting_outage_is_ridden_out(tmp_path, accounting_outage):
    config = sweep_config(tmp_path / "sweep.yaml", runs=2, runs_per_job=1)
    marker = tmp_path / "stopped.pid"
    path, calls = logged_clients(tmp_path, ("sacct",))
    proc = start(tmp_path, config, PATH=path,
                 **stop_at("before-first-batch", "segment-1", marker))
    frozen = self_stopped(marker, proc)
    accounting_outage()
    down = time.time()
    time.sleep(20)  # several status checks (1 s apart) meet no accounting
    os.kill(frozen, signal.SIGCONT)
    time.sleep(20)  # the first segments end while accounting is down
    subprocess.run(["bash", CLUSTER, "start"], check=True, capture_output=True)
    up = time.time()
    out = proc.communicate(timeout=900)[0]
    asked = status_queries(calls)
    assert any(down < t < up for t in asked) and any(t > up for t in asked), (down, up, asked)
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert max(gaps) <= PLUGIN_LONGEST_INTERVAL_S + SACCT_TIMEOUT_S, gaps
    assert proc.returncode == 0, out[-4000:]
    assert out.count("Slurm's accounting (the status command, sacct) does not answer") == 1
    assert "Slurm's accounting answers again" in out, out[-4000:]
    rows = summary_rows(tmp_path)
    assert len(rows) == 2 and {r["status"] for r in rows.values()} == {"ok"}, rows
    assert {r["attempts"] for r in rows.values()} == {"2"}  # 2 segments, one try each


@pytest.fixture
def controller_restart():
    """Stops slurmctld (its state saved) when called; starts the cluster's daemons again
    after the test, whatever it did."""
    def stop():
        subprocess.run(["bash", CLUSTER, "stop-controller"], check=True, capture_output=True)

    yield stop
    subprocess.run(["bash", CLUSTER, "start"], check=True, capture_output=True)


def test_a_slurmctld_restart_is_ridden_out(tmp_path, controller_restart):
    """slurmctld stopped for half a minute while the sweep's first segments are queued and
    one trains (they end while it is down: slurmd tells it once it is back), then started
    with its saved state: every row ok, one try each, usage from sacct."""
    config = sweep_config(tmp_path / "sweep.yaml", runs=2, runs_per_job=1)
    marker = tmp_path / "stopped.pid"
    proc = start(tmp_path, config, **stop_at("before-first-batch", "segment-1", marker))
    frozen = self_stopped(marker, proc)
    controller_restart()
    time.sleep(10)
    os.kill(frozen, signal.SIGCONT)
    time.sleep(20)
    subprocess.run(["bash", CLUSTER, "start"], check=True, capture_output=True)
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, out[-4000:]
    rows = summary_rows(tmp_path)
    assert len(rows) == 2 and {r["status"] for r in rows.values()} == {"ok"}, rows
    assert {r["attempts"] for r in rows.values()} == {"2"}  # 2 segments, one try each
    assert {r["usage_from"] for r in rows.values()} == {"sacct"}, rows


@pytest.fixture
def submit_limit():
    """Sets MaxSubmitJobs on the user's CPU association when called; puts back what it was
    after the test."""
    def assoc(*what):
        return subprocess.run(["sacctmgr", "-i", *what], check=True, capture_output=True,
                              text=True).stdout
    where = ["where", f"user={os.environ.get('USER', 'root')}", f"account={CPU_ACCOUNT}"]
    before = assoc("-n", "-P", "show", "assoc", *where, "format=MaxSubmit").strip() or "-1"

    def set_to(limit: int) -> None:
        assoc("modify", "user", *where, "set", f"MaxSubmitJobs={limit}")

    yield set_to
    set_to(before)


def test_a_sweep_waits_for_room_in_the_users_share_of_the_queue(tmp_path, submit_limit):
    prefix = slurm_job_prefix(tmp_path)
    submit_limit(4)
    held = [subprocess.run(["sbatch", "--parsable", "--hold", "-A", CPU_ACCOUNT, "--mem=100",
                            "--output=/dev/null", f"--job-name={prefix}_held", "--wrap", "true"],
                           capture_output=True, text=True, check=True).stdout.strip()
            for _ in range(2)]
    config = sweep_config(tmp_path / "sweep.yaml", runs=12, runs_per_job=1, segments=1)
    proc = start(tmp_path, config, "--jobs", 4)  # what -n asks for, at the limit
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, out[-4000:]
    assert out.count("waiting: ") == 1, out[-4000:]
    assert re.search(r"waiting: [34] of your jobs queued, MaxSubmitJobs 4: each submission "
                     r"waits", out), out[-4000:]
    assert "SLURM sbatch failed" not in out
    rows = summary_rows(tmp_path)
    assert len(rows) == 12 and {r["status"] for r in rows.values()} == {"ok"}, rows
    assert {r["attempts"] for r in rows.values()} == {"1"}  # one try each
    states = slurm_jobs(prefix)
    assert [states[job][0] for job in held] == ["PENDING", "PENDING"], states
