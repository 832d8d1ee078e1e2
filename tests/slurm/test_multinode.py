"""Multi-node runs on the test cluster's nodes n1 and n2 (partition multi), each a slurmd in
its own network, UTS and mount namespace (tests/slurm/cluster.sh): its own address, hostname
and node-local /localscratch. Everything goes through --profile profiles/slurm."""

import csv
import json
import os
import re
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from conftest import PY, ROOT, assert_bit_identical, build_wheelhouse, cli, metrics_of, state_of
from conftest import (probe_wheel, run_batches, slurm_job_prefix, slurm_jobs, summary_rows,
                      train_until_saved)
from cifarflow.controller.wheelhouse import CORE_STACK, CURVES, installed_closure, job_requirements
from alliance import GPU_ACCOUNT
from test_slurm import CONFIG, job_state, slurm, start_slurm, submitted, training_processes

pytestmark = pytest.mark.slurm
NODES = ["n1", "n2"]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"


@pytest.fixture(scope="module", autouse=True)
def two_nodes():
    states = subprocess.run(["sinfo", "-h", "-p", "multi", "-N", "-o", "%N %T"],
                            capture_output=True, text=True).stdout.split()
    if states[0::2] != NODES or not all(re.match(r"idle|mix|alloc", s) for s in states[1::2]):
        pytest.fail(f"nodes n1, n2 not up ({states}): run `bash tests/slurm/cluster.sh start`")


def multi_config(tmp_path, **sections) -> Path:
    path = tmp_path / "multi.yaml"
    path.write_text(json.dumps({"slurm": {"partition": "multi"}, **sections}))
    return path


def job_nodes(jobid: str) -> tuple[int, str]:
    show = subprocess.run(["scontrol", "show", "job", jobid], capture_output=True, text=True,
                          check=True).stdout
    return (int(re.search(r"NumNodes=(\d+)", show).group(1)),
            re.search(r"\bNodeList=(\S+)", show).group(1))


def train_jobs(text: str) -> list[str]:
    return [j for rule, ids in submitted(text).items() if rule.startswith("train_") for j in ids]


def reference_model(work: Path, run: str, tmp_path: Path, nproc: int) -> dict:
    """The same spec trained in one go by local processes on this host."""
    cli("launch", "--nproc", nproc, "--", PY, "-m", "cifarflow", "train",
        "--spec", work / f"results/runs/{run}/spec.json",
        "--data", run_batches(work, run), "--out", tmp_path / f"ref-{run}",
        "--threads", 1, timeout=900)
    return state_of(tmp_path / f"ref-{run}")["model"]


@pytest.fixture(scope="module")
def one_rank_per_node(tmp_path_factory):
    work = tmp_path_factory.mktemp("multinode")
    extra = multi_config(work, strategies=["ddp", "fsdp", "lightning"],
                         distributed={"world_size": 2, "nodes": 2})
    out = slurm(work, configfile=[CONFIG, extra])
    return work, out.stdout + out.stderr


def test_each_segment_job_spans_two_nodes(one_rank_per_node):
    work, text = one_rank_per_node
    jobs = train_jobs(text)
    assert len(jobs) == 6  # 3 strategies x 2 segments
    for jobid in jobs:
        assert job_state(jobid) == "COMPLETED"
        assert job_nodes(jobid) == (2, "n[1-2]")
    assert re.search(r"sbatch call: sbatch .*--nodes=2 .*--ntasks=2", text)


def test_every_node_of_a_job_trains_on_its_own_staged_copy(one_rank_per_node):
    """data.stage auto: in every segment job, each node copies the split once into its own
    node-local /localscratch (a folder per node, cluster.sh), md5-verified, and its rank
    reads it from there."""
    work, text = one_rank_per_node
    jobs = set(train_jobs(text))
    for run in ("ddp", "fsdp", "lightning"):
        for k in (1, 2):
            log = (work / f"results/logs/train/{run}/segment-{k}.log").read_text()
            staged = re.findall(r"\[data\] (n\d): staged 7 files \([\d.]+ MB\) of \S+ to "
                                r"/localscratch/root\.(\d+)\.0/cifarflow-data/cifar-10-batches-py "
                                r"in [\d.]+ s, md5 verified", log)
            assert sorted(node for node, _ in staged) == NODES, (run, k, log[-2000:])
            assert len({job for _, job in staged}) == 1 and staged[0][1] in jobs


def test_metrics_record_the_host_of_every_rank(one_rank_per_node):
    work, _ = one_rank_per_node
    rows = {r["run"]: r for r in csv.DictReader(open(work / "results/summary.csv"))}
    for run in ("ddp", "fsdp", "lightning"):
        for epoch in metrics_of(work / f"results/runs/{run}/segment-2"):
            assert epoch["hosts"] == NODES  # rank 0 on n1, rank 1 on n2
        assert (rows[run]["status"], rows[run]["hosts"], rows[run]["world_size"]) == \
            ("ok", "n1 n2", "2")
        log = (work / f"results/logs/train/{run}/segment-2.log").read_text()
        assert "ranks: 0 on n1" in log and "1 on n2" in log


def test_a_run_across_nodes_equals_the_same_run_on_one_host(one_rank_per_node, tmp_path):
    """Two ddp segments on two nodes (gloo over the nodes' network) give the weights that
    two local processes training in one go give. (Lightning refuses nodes: 2 outside srun.)"""
    work, _ = one_rank_per_node
    assert_bit_identical(state_of(work / "results/runs/ddp/segment-2")["model"],
                         reference_model(work, "ddp", tmp_path, nproc=2))
    refused = cli("launch", "--nproc", 2, "--", PY, "-m", "cifarflow", "train", "--spec",
                  work / "results/runs/lightning/spec.json", "--data",
                  run_batches(work, "lightning"), "--out", tmp_path / "l", check=False)
    assert "lightning on 2 nodes takes its ranks from srun" in refused.stdout + refused.stderr


def test_four_ranks_on_two_nodes(tmp_path):
    extra = multi_config(tmp_path, strategies=["ddp"], segments={"count": 1},
                         distributed={"world_size": 4, "nodes": 2})
    out = slurm(tmp_path, configfile=[CONFIG, extra])
    text = out.stdout + out.stderr
    assert re.search(r"sbatch call: sbatch .*--nodes=2 .*--ntasks-per-node=2", text)
    (jobid,) = train_jobs(text)
    assert job_nodes(jobid) == (2, "n[1-2]")
    assert metrics_of(tmp_path / "results/runs/ddp/segment-1")[-1]["hosts"] == \
        ["n1", "n1", "n2", "n2"]


# The jobs see the wheelhouse alone, like an Alliance compute node: none of this machine's
# pip configuration (its package indexes, its folder of wheels)
ONLY_THE_WHEELHOUSE = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PYTHONPATH": ""}


@pytest.mark.slow  # the node installs the real stack (~5.5 GB: torch and its CUDA libraries)
@pytest.mark.variant  # a job venv from a wheelhouse, on each node: test_slurm_pack.py
def test_slurm_tmpdir_builds_the_real_training_stack_on_the_node(tmp_path):
    """env.mode slurm_tmpdir, the requirements derived from this venv (the training stack at
    its versions): the plan checks the wheelhouse, then the node of a ddp job builds its own
    venv in its node-local SLURM_TMPDIR from the wheelhouse alone (--no-index --find-links:
    torch, torchvision, tensorboard and all they need), and both ranks train with that
    venv's Python. The build time reaches summary.csv. (A job on two nodes builds one on
    each: test_slurm_pack.py's pack spread over n1 and n2, with a small wheel.)"""
    extra = multi_config(tmp_path, strategies=["ddp"], segments={"count": 1},
                         distributed={"world_size": 2, "nodes": 1},
                         resources={"cpus_per_task": 1, "mem_mb": 3000, "runtime": 30},
                         env={"mode": "slurm_tmpdir", "pip_no_index": True,
                              "find_links": str(tmp_path / "wheelhouse")})
    # what the plan will ask for (a cpu ddp run with curves), at this venv's versions: the
    # wheelhouse holds exactly that
    required = [line for line in job_requirements(installed_closure(CORE_STACK + (CURVES,)))
                .splitlines() if not line.startswith("#")]
    build_wheelhouse(required, tmp_path / "wheelhouse")
    t0 = time.time()
    out = slurm(tmp_path, configfile=[CONFIG, extra], env=ONLY_THE_WHEELHOUSE, timeout=2400)
    print(f"ddp with a job venv of the real stack: {time.time() - t0:.0f} s")
    text = out.stdout + out.stderr
    assert "holds every job requirement" in text
    jobid = next(j for j in train_jobs(text))
    (node,) = [n for n in NODES if job_nodes(jobid) == (1, n)]
    venv = f"/localscratch/root.{jobid}.0/env"
    log = (tmp_path / "results/logs/train/ddp/segment-1.log").read_text()
    assert re.search(rf"\[env\] {node}: {venv} ready", log), log[:2000]
    assert f"ranks: 0 on {node} (python {venv}), 1 on {node} (python {venv})" in log
    assert not Path(venv).exists()  # node-local: never on this host (and removed at job end)
    freeze = (tmp_path / "results/environment/pip-freeze.txt").read_text()
    assert f"torch=={version('torch')}" in freeze  # the environment record ran in one too
    assert "snakemake" not in freeze and "pandas" not in freeze
    row = summary_rows(tmp_path)["ddp"]
    assert row["status"] == "ok" and float(row["env_build_s"]) >= 1, row


def test_a_plan_the_wheelhouse_cannot_build_submits_nothing(tmp_path):
    """The wheelhouse check refuses the plan before the first sbatch: a requirement at a
    version the wheelhouse lacks is named with the versions it has; no job is queued."""
    wheels = probe_wheel(tmp_path / "wheelhouse", version="0.1")
    (tmp_path / "requirements.txt").write_text("cifarflow-probe==0.2\n")
    extra = multi_config(tmp_path, strategies=["ddp"], segments={"count": 1},
                         distributed={"world_size": 2, "nodes": 2},
                         env={"mode": "slurm_tmpdir", "requirements": str(tmp_path / "requirements.txt"),
                              "find_links": str(wheels), "pip_no_index": True})
    out = slurm(tmp_path, configfile=[CONFIG, extra], env=ONLY_THE_WHEELHOUSE, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "cifarflow-probe==0.2 (the wheelhouse has 0.1)" in text, text[-3000:]
    assert "sbatch call" not in text
    assert slurm_jobs(slurm_job_prefix(tmp_path)) == {}


def test_node_failure_reruns_the_segment_on_the_other_node_and_resumes_exactly(tmp_path):
    """A two-rank segment runs on one node; once it has an in-segment checkpoint the node
    loses power (its slurmd and every process on it are killed). Slurm marks the node down
    and requeues the job (profiles/slurm: slurm-requeue): the same job id reruns on the
    other node, its try logs to segment-1.attempt1.requeue1.log, resumes from the
    checkpoint, and the summary counts the requeue; the final weights equal an
    uninterrupted run's."""
    extra = multi_config(tmp_path, strategies=["ddp"], segments={"count": 1},
                         distributed={"world_size": 2, "nodes": 1},
                         train={"epochs": 4, "batch_size": 20, "checkpoint_interval_s": 0.5})
    proc = start_slurm(tmp_path, CONFIG, extra)
    work = tmp_path / "results/runs/ddp/work"
    t0, node = time.time(), None
    try:
        ranks = []
        while time.time() - t0 < 300 and len(ranks) < 2:
            for jobid in slurm_jobs(slurm_job_prefix(tmp_path), "R"):  # the env job may run too
                ranks = training_processes(jobid)
                if len(ranks) == 2:
                    node, segment_job = job_nodes(jobid)[1], jobid
                    break
            time.sleep(0.05)
        assert len(ranks) == 2, "the segment's ranks never ran"
        # frozen after their first in-segment save until the node is gone
        frozen = train_until_saved(ranks, work)  # the save the rerun goes on from
        assert node in NODES, node
        subprocess.run(["bash", str(CLUSTER), "kill-node", node], check=True)
        output = proc.communicate(timeout=900)[0]
        down = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True,
                              text=True).stdout.strip()
    finally:
        proc.kill()
        subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True)
    assert proc.returncode == 0, output[-3000:]
    assert down.startswith("down"), down  # the node, seen before the cluster restarted it
    other = next(n for n in NODES if n != node)
    manifest = json.loads((tmp_path / "results/runs/ddp/segment-1/checkpoint.json").read_text())
    last = manifest["segment_runs"][-1]
    assert manifest["done"] and last["hosts"] == [other, other]
    assert (last["slurm_job_id"], last["attempt"], last["requeue"]) == (segment_job, 1, 1)
    assert job_state(segment_job) == "COMPLETED"
    show = subprocess.run(["scontrol", "show", "job", segment_job], capture_output=True,
                          text=True, check=True).stdout
    assert "Restarts=1" in show, show
    logs = tmp_path / "results/logs/train/ddp"
    assert sorted(p.name for p in logs.glob("segment-1.attempt*.log")) == [
        "segment-1.attempt1.log", "segment-1.attempt1.requeue1.log"]  # each try its own
    assert (f"resumed from results/runs/ddp/work at epoch {frozen['epoch'] + 1}, batch "
            f"{frozen['step']}\n") in (logs / "segment-1.attempt1.requeue1.log").read_text()
    row = summary_rows(tmp_path)["ddp"]
    assert (row["status"], row["attempts"], row["requeues"]) == ("ok", "1", "1")
    assert_bit_identical(state_of(tmp_path / "results/runs/ddp/segment-1")["model"],
                         reference_model(tmp_path, "ddp", tmp_path, nproc=2))


# what each CUDA strategy must ask for, 2 processes of 1000 MB on one node (mps: replicas):
# typed GPUs as Alliance documents them, the type the test cluster's nodes have (a100:2 on
# n1, h100:2 on n2: of several, the most GPUs, a tie broken by name: a100)
GPU_REQUESTS = {  # strategy: (sbatch flags, scontrol show job fields)
    "gpu": (["--gpus-per-node=a100:1", "--mem 1000"],
            ["NumTasks=1", "TresPerNode=gres:gpu:a100:1"]),
    "ddp": (["--gpus-per-node=a100:2", "--mem 2000", "--ntasks-per-node=2"],
            ["NumTasks=2", "TresPerNode=gres:gpu:a100:2"]),
    "fsdp": (["--gpus-per-node=a100:2", "--mem 2000", "--ntasks-per-node=2"],
             ["NumTasks=2", "TresPerNode=gres:gpu:a100:2"]),
    "lightning": (["--gpus-per-node=a100:2", "--mem 2000", "--ntasks-per-node=2"],
                  ["NumTasks=2", "TresPerNode=gres:gpu:a100:2"]),
    "mps": (["--gpus-per-node=a100:1", "--mem 2000", "--ntasks-per-node=2"],
            ["NumTasks=2", "TresPerNode=gres:gpu:a100:1"]),
}
NO_CUDA = {s: f"strategy '{s}' needs a CUDA GPU but none is visible"
           for s in ("gpu", "ddp", "fsdp", "lightning")}
NO_CUDA["mps"] = "mps: needs an NVIDIA GPU with MPS, but nvidia-cuda-mps-control not found"


def test_cuda_strategies_request_their_gpus_and_fail_in_one_line(tmp_path):
    """On nodes that advertise (fake) GPUs, every CUDA strategy asks by one rule: GPUs and
    tasks per node, memory per process x processes per node. Slurm grants it; then each
    segment stops at its one-line "no CUDA" error (nothing here has CUDA). MPS puts its
    pipe and log directories in the job's node-local SLURM_TMPDIR."""
    extra = multi_config(tmp_path, strategies=list(GPU_REQUESTS), segments={"count": 1},
                         distributed={"world_size": 2, "nodes": 1, "device": "cuda"},
                         mps={"replicas": 2},
                         resources={"cpus_per_task": 1, "mem_mb": 1000, "runtime": 10})
    out = slurm(tmp_path, "--keep-going", "--retries", "0", configfile=[CONFIG, extra],
                check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    jobs = submitted(text)
    for strategy, (flags, fields) in GPU_REQUESTS.items():
        call = next(l for l in text.splitlines()
                    if "sbatch call" in l and f"rule_train_{strategy}_" in l)
        for flag in flags + [f"-A {GPU_ACCOUNT}"]:  # def-cifar, mapped: a GPU job
            assert f" {flag} " in call, (strategy, flag, call)
        (jobid,) = set(jobs[f"train_{strategy}"])
        show = subprocess.run(["scontrol", "show", "job", jobid], capture_output=True,
                              text=True, check=True).stdout
        for field in fields:
            assert field in show, (strategy, field, show)
        assert job_state(jobid) == "FAILED"
        log = (tmp_path / f"results/logs/train/{strategy}/segment-1.log").read_text()
        # besides the launchers' own lines, one line (said by each rank), no traceback
        said = {l for l in log.splitlines()
                if not l.startswith(("[launch]", "[mps]", "srun:", "slurmstepd"))}
        assert len(said) == 1 and NO_CUDA[strategy] in said.pop(), (strategy, log[-2000:])
    # the environment check asks for one GPU too, and says on its node what is wrong
    call = next(l for l in text.splitlines() if "sbatch call" in l and "rule_record_env" in l)
    assert " --gpus-per-node=a100:1 " in call  # typed, as the training jobs
    env_log = (tmp_path / "results/logs/record_environment.log").read_text()
    assert re.search(r"record-env: error: runs train on cuda but torch \S+ sees no GPU on n[12] "
                     r"\(driver: none\)", env_log), env_log
    mps_log = (tmp_path / "results/logs/train/mps/segment-1.log").read_text()
    jobid = jobs["train_mps"][0]
    assert f"CUDA_MPS_PIPE_DIRECTORY=/localscratch/root.{jobid}.0/nvidia-mps-{jobid}/pipe" in mps_log
