"""An MPS-shared GPU pack (pack.per_gpu) on the test cluster's fake GPUs (partition multi:
n1, n2, 2 GPUs and 2 CPUs each; nothing has CUDA or MPS). What can be checked honestly
without a GPU: the request Slurm granted (tasks, one node, GPUs = members / per_gpu), that
the job started exactly one step holding its node's GPUs, what that step saw (Slurm's
CUDA_VISIBLE_DEVICES), where it placed each member and its MPS pipe directory on the node's
own disk, and the one line it stops at without MPS, before any member starts. Members
training on a shared GPU need a GPU machine."""

import re
import subprocess

import pytest

from conftest import ROOT
from test_multinode import multi_config
from test_slurm import CONFIG, job_state, slurm, submitted

pytestmark = pytest.mark.slurm


def test_a_shared_gpu_pack_is_one_step_holding_its_gpus_that_places_its_members(tmp_path):
    extra = multi_config(tmp_path, strategies=["gpu"], segments={"count": 1},
                         sweep={"lr": [0.01, 0.02]}, pack={"runs_per_job": 2, "per_gpu": 2},
                         resources={"cpus_per_task": 1, "mem_mb": 1000, "runtime": 10})
    dry = slurm(tmp_path, "-n", configfile=[CONFIG, extra])
    assert ("pack: 2 runs of gpu in 1 packs of up to 2, one job per pack and segment; each "
            "pack job on one node (pack.nodes: 1); 1 GPU pack(s) share each GPU between 2 members through one private MPS daemon per node "
            "(a pack of 2 asks gres=gpu:1; one Slurm step holds the node's GPUs and starts the "
            "members)") in dry.stdout + dry.stderr
    out = slurm(tmp_path, "--keep-going", "--retries", "0", configfile=[CONFIG, extra],
                check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    call = next(l for l in text.splitlines()
                if "sbatch call" in l and "rule_train_gpu_" in l)
    assert " --gpus-per-node=a100:1" in call, call  # typed: the nodes' type (a100, h100)
    (jobid,) = set(submitted(text)["train_gpu"])
    show = subprocess.run(["scontrol", "show", "job", jobid], capture_output=True, text=True,
                          check=True).stdout
    for field in ("NumNodes=1", "NumTasks=2", "TresPerNode=gres:gpu:a100:1"):
        assert field in show, (field, show)
    assert job_state(jobid) == "FAILED"
    log = (tmp_path / "results/logs/packs/gpu-pack001/segment-1.log").read_text()
    # the batch script started one step: the node's GPU, both members' cores and memory
    steps = [l for l in log.splitlines() if "one Slurm step holds the node's GPUs" in l]
    assert len(steps) == 1, log
    assert re.search(r"srun --exact --ntasks=1 --nodes=1 --cpus-per-task=2 --mem-per-cpu=1000 "
                     r"--kill-on-bad-exit=1 --job-name=gpu-pack001 --gres=gpu:1 \S+ -m "
                     r"cifarflow train-pack --pack gpu-pack001 .* --per-gpu 2 --in-step .* --members "
                     r"gpu_lr0p01 gpu_lr0p02$", steps[0]), steps[0]
    # inside it, step 0 of the job, on one node: Slurm's GPU, the placement, the MPS pipes
    inside = [l for l in log.splitlines() if re.match(r"\[pack gpu-pack001\] step \d", l)]
    assert len(inside) == 1, log
    assert re.fullmatch(
        rf"\[pack gpu-pack001\] step {jobid}\.0 on n[12]: 1 GPU\(s\) \(CUDA_VISIBLE_DEVICES=0\), "
        rf"2 member\(s\) per GPU under one private MPS daemon, CUDA_MPS_PIPE_DIRECTORY="
        rf"/localscratch/\S+/nvidia-mps-{jobid}/pipe", inside[0]), inside[0]
    assert "[pack gpu-pack001] placement: GPU 0: gpu_lr0p01, gpu_lr0p02\n" in log
    assert ("[pack gpu-pack001] pack.per_gpu 2: the members share GPUs through NVIDIA MPS, but "
            "nvidia-cuda-mps-control not found (no NVIDIA driver on this node): run on a GPU "
            "node (profiles/slurm asks for GPUs) or set pack.per_gpu: 1") in log
    # and nothing more: no member started, none has a log
    assert "started (attempt" not in log and "Traceback" not in log, log
    assert not list((tmp_path / "results/logs/train").glob("*/segment-1.attempt*.log"))


def test_a_gpu_pack_is_one_step_whose_tasks_each_see_their_own_gpu(tmp_path):
    """A pack of 2 one-GPU members (no MPS): one job asking both GPUs of a node, ONE step
    whose two tasks Slurm binds to a GPU each (`--gpus-per-task`; issue 47: a step per member
    cost 3 RPCs each), each member in its own log with its GPU and its own exit status (no
    CUDA here: each fails alone, after both started)."""
    extra = multi_config(tmp_path, strategies=["gpu"], segments={"count": 1},
                         sweep={"lr": [0.01, 0.02]}, pack={"runs_per_job": 2},
                         resources={"cpus_per_task": 1, "mem_mb": 1000, "runtime": 10})
    out = slurm(tmp_path, "--keep-going", "--retries", "0", configfile=[CONFIG, extra],
                check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    (jobid,) = set(submitted(text)["train_gpu"])
    show = subprocess.run(["scontrol", "show", "job", jobid], capture_output=True, text=True,
                          check=True).stdout
    for field in ("NumNodes=1", "NumTasks=2"):
        assert field in show, (field, show)
    assert re.search(r"TresPerNode=gres:gpu:a100:2\b", show), show
    log = (tmp_path / "results/logs/packs/gpu-pack001/segment-1.log").read_text()
    assert re.search(r"2 member\(s\) as the tasks of one Slurm step: srun --ntasks=2 "
                     r"--cpus-per-task=1 --mem-per-cpu=1000 --gpus-per-task=1 "
                     r"--kill-on-bad-exit=0 --job-name=gpu-pack001 sh \S+\.step\.sh", log), log
    steps = subprocess.run(["sacct", "-n", "-P", "-j", jobid, "-o", "JobID"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert [s for s in steps if "." in s and s.split(".")[1].isdigit()] == [f"{jobid}.0"], steps
    seen = {}
    for run in ("gpu_lr0p01", "gpu_lr0p02"):
        member = (tmp_path / f"results/logs/train/{run}/segment-1.log").read_text()
        task = re.search(rf"\[pack gpu-pack001\] {run}: task (\d) of step {jobid}\.0 on "
                         r"(n[12]), CUDA_VISIBLE_DEVICES=(\d)\n", member)
        assert task, member
        seen[run] = task.groups()
        assert f"[pack gpu-pack001] {run}: FAILED with exit status" in log, log
    assert {t[0] for t in seen.values()} == {"0", "1"}  # a task each
    assert len({t[1] for t in seen.values()}) == 1  # on one node
    assert {t[2] for t in seen.values()} == {"0", "1"}, seen  # a GPU each
