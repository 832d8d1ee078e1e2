"""Packed segments (pack.runs_per_job): one job trains segment k of several sweep members.
Planning and the chain walk in-process; local and Slurm runs for real, compared with the
same sweep unpacked."""

import copy
import re
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import ENV, PY, ROOT, assert_bit_identical, snakemake, state_of
from cifarflow.chain import Chain
from cifarflow.config import with_defaults
from cifarflow.plan import build_packs, build_runs

BASE = with_defaults(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))


def plan(**over):
    cfg = copy.deepcopy(BASE)
    for key, value in over.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and key != "sweep" else value
    return build_runs(cfg)


def test_packs_hold_runs_of_one_strategy_and_one_request():
    runs = plan(strategies=["cpu", "ddp"],
                sweep={"lr": [0.1, 0.2, 0.3], "cpus_per_task": [1, 2]})
    packs = build_packs(runs, 2)
    assert {p.strategy for p in packs.values()} == {"cpu"}  # ddp: several processes per run
    for pack in packs.values():
        assert 1 <= len(pack.members) <= 2
        requests = {repr(sorted(runs[m].resources.items())) for m in pack.members}
        assert len(requests) == 1, pack  # never a member in a job of the wrong size
        assert pack.member_resources == runs[pack.members[0]].resources
    packed = sorted(m for p in packs.values() for m in p.members)
    assert packed == sorted(n for n in runs if n.startswith("cpu"))
    assert len(packs) == 4  # 3 runs of cpus 1 -> 2 packs, 3 of cpus 2 -> 2 packs
    assert build_packs(runs, 1) == {}


class Pending(Exception):
    pass


def write_segment(root: Path, run: str, k: int, done: bool, test_acc: float) -> str:
    path = root / run / f"segment-{k}"
    path.mkdir(parents=True)
    (path / "checkpoint.json").write_text(json.dumps({"format": 1, "done": done}))
    (path / "metrics.jsonl").write_text(json.dumps({"epoch": k, "test_acc": test_acc}) + "\n")
    return str(path)


def test_chain_gives_each_pack_segment_the_members_that_need_it(tmp_path):
    """4 runs in 2 packs, 3 planned segments, the best half kept after segment 1; one
    survivor stops early in segment 3 and needs a fourth."""
    runs = plan(sweep={"lr": [0.1, 0.2, 0.3, 0.4]}, train={"epochs": 3},
                segments={"count": 3})
    packs = build_packs(runs, 2)
    prune = {"metric": "test_acc", "keep": 0.5, "min_runs": 1, "at_segments": [1]}
    have = {}

    def segment_of(run, k):
        if (run, k) not in have:
            raise Pending(run, k)
        return have[(run, k)]

    chain = Chain(runs, packs, prune, 13, segment_of, Pending)
    names = list(runs)
    assert chain.members("cpu-pack001", 1) == names[:2]
    with pytest.raises(Pending):
        chain.members("cpu-pack001", 2)  # the ranking is not known yet
    for i, run in enumerate(names):
        have[(run, 1)] = write_segment(tmp_path, run, 1, False, test_acc=i / 10)
    assert chain.alive_after("cpu", 1) == (names[3], names[2])
    assert chain.members("cpu-pack001", 2) == [] and chain.members("cpu-pack002", 2) == names[2:]
    assert chain.known_pruned_at(names[0]) == 1 and chain.known_pruned_at(names[3]) is None
    for run in names[2:]:
        have[(run, 2)] = write_segment(tmp_path, run, 2, False, 0.5)
    have[(names[2], 3)] = write_segment(tmp_path, names[2], 3, True, 0.6)
    have[(names[3], 3)] = write_segment(tmp_path, names[3], 3, False, 0.6)  # stopped early
    assert chain.members("cpu-pack002", 4) == [names[3]]
    assert chain.final_segment(names[2]).endswith("segment-3")
    assert chain.final_segment(names[0]).endswith("segment-1")
    with pytest.raises(Pending):
        chain.final_segment(names[3])


SWEEP = ("strategies: [cpu]\ndata: {{source: synthetic, synthetic: {{train_size: 1000, "
         "test_size: 200}}}}\ntrain: {{epochs: 2, batch_size: 100, log_interval_s: 100}}\n"
         "segments: {{count: 2}}\nresources: {{cpus_per_task: 1, mem_mb: 1000, runtime: 10}}\n"
         "sweep: {{lr: {lrs}}}\npack: {{runs_per_job: {k}}}\n")


def sweep_config(path: Path, runs: int, k: int) -> Path:
    path.write_text(SWEEP.format(lrs=[round(0.01 * (i + 1), 4) for i in range(runs)], k=k))
    return path


def final_states(work: Path) -> dict:
    return {run.name: state_of(max(run.glob("segment-*"), key=lambda p: int(p.name[8:])))
            for run in sorted((work / "results/runs").iterdir())}


@pytest.fixture(scope="module")
def unpacked_reference(tmp_path_factory):
    """The 16-run sweep unpacked, trained locally: what every packed run must equal."""
    work = tmp_path_factory.mktemp("unpacked")
    snakemake(work, "--cores", "2", configfile=sweep_config(work / "c.yaml", 16, 1))
    return final_states(work)


def children(pid: int) -> list[int]:
    """Every process under `pid` (its process tree, this test's own processes only)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        found = []
        for task in Path(f"/proc/{parent}/task").glob("*"):  # threads start processes too
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        out += found
        todo += found
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_local_pack_equals_unpacked_and_retries_only_the_killed_member(tmp_path,
                                                                      unpacked_reference):
    """4 runs in 2 packs of 2 under `snakemake --cores 2 --retries 1`; one member is
    SIGKILLed while it trains: its pack job fails once the other member finished, and the
    retry trains the killed member alone. Final weights equal the unpacked sweep's."""
    config = sweep_config(tmp_path / "c.yaml", 4, 2)
    cmd = [str(Path(PY).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory",
           str(tmp_path), "--configfile", str(config), "--cores", "2", "--retries", "1"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    victim = "cpu_lr0p02"
    deadline, killed = time.time() + 300, None
    while killed is None and time.time() < deadline and proc.poll() is None:
        for pid in children(proc.pid):
            if f"train --spec results/runs/{victim}/spec.json" in cmdline(pid):
                os.kill(pid, signal.SIGKILL)
                killed = pid
                break
        time.sleep(0.02)
    output = proc.communicate(timeout=600)[0]
    assert killed, "the member's training process never appeared"
    assert proc.returncode == 0, output[-4000:]
    logs = tmp_path / "results/logs"
    pack_log = (logs / "packs/cpu-pack001/segment-1.log").read_text()
    assert f"{victim}: started (attempt 2" in pack_log
    assert "cpu_lr0p01: segment 1 already published, not retrained" in pack_log
    assert sorted(p.name for p in (logs / f"train/{victim}").glob("segment-1.*")) == [
        "segment-1.attempt1.log", "segment-1.attempt2.log", "segment-1.log"]
    assert not list((logs / "train/cpu_lr0p01").glob("segment-1.attempt2.log"))
    rows = {r["run"]: r for r in __import__("csv").DictReader(
        open(tmp_path / "results/summary.csv"))}
    assert rows[victim]["attempts"] == "3" and rows["cpu_lr0p01"]["attempts"] == "2"
    assert {r["status"] for r in rows.values()} == {"ok"}
    for run, state in final_states(tmp_path).items():
        assert_bit_identical(state["model"], unpacked_reference[run]["model"])


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


def running_pack_jobs() -> dict:
    """job id -> pack wildcards of the running pack jobs (from the plugin's comment)."""
    out = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i %k"], capture_output=True,
                         text=True).stdout.split()
    return {j: c for j, c in zip(out[0::2], out[1::2]) if c.startswith("rule_train_cpu_")}


@pytest.mark.slurm
def test_slurm_pack_spreads_over_two_nodes_equals_unpacked_and_retries_one_member(
        tmp_path, unpacked_reference):
    """16 runs in packs of 4 on partition multi (n1 and n2, 2 cores each): 4 jobs per
    round, each of 4 one-core tasks that Slurm spreads over both nodes. One member is
    SIGKILLed while it trains; only it is retried. Final weights equal the unpacked
    sweep's bit for bit."""
    from test_slurm import start_slurm, submitted

    config = sweep_config(tmp_path / "c.yaml", 16, 4)
    multi = tmp_path / "multi.yaml"
    multi.write_text("slurm: {partition: multi}\n")
    proc = start_slurm(tmp_path, config, multi, args=["--verbose"])
    deadline, victim = time.time() + 600, None
    while victim is None and time.time() < deadline and proc.poll() is None:
        for jobid in running_pack_jobs():
            for pid in job_processes(jobid):
                line = cmdline(pid)
                if " cifarflow train --spec results/runs/" in line:
                    os.kill(pid, signal.SIGKILL)
                    victim = line.split("results/runs/")[1].split("/")[0]
                    break
            if victim:
                break
        time.sleep(0.05)
    output = proc.communicate(timeout=900)[0]
    assert victim, "no member process seen in a running pack job"
    assert proc.returncode == 0, output[-4000:]
    calls = [c for c in output.splitlines() if "sbatch call" in c and "rule_train_cpu" in c]
    assert len(calls) == 4 * 2 + 1 and all(
        "--ntasks=4 --cpus-per-task=1" in c and "--mem-per-cpu 1000" in c for c in calls)
    packs = sorted(set(re.findall(r"rule_train_cpu_wildcards_(cpu-pack\d+_\d+)", output)))
    assert len(packs) == 4 * 2  # 4 packs, 2 segments
    assert len(set(submitted(output)["train_cpu"])) == 4 * 2 + 1  # and the one retry
    logs = tmp_path / "results/logs/train"
    retried = sorted(p.parent.name for p in logs.glob("*/segment-*.attempt2.log"))
    assert retried == [victim]
    rows = {r["run"]: r for r in __import__("csv").DictReader(
        open(tmp_path / "results/summary.csv"))}
    assert {r["status"] for r in rows.values()} == {"ok"} and len(rows) == 16
    record = json.loads((tmp_path / "results/packs/cpu-pack001/segment-2.json").read_text())
    hosts = {h for run in record["members"] for h in rows[run]["hosts"].split()}
    assert hosts == {"n1", "n2"}  # one job, its members on both nodes
    for run, state in final_states(tmp_path).items():
        assert_bit_identical(state["model"], unpacked_reference[run]["model"])
