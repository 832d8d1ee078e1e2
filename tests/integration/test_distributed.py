"""Distributed strategies with 2 real gloo ranks on CPU, and the CUDA-only strategies'
fail-fast paths (their launch plans are checked up to the CUDA check)."""

import os

import pytest
import torch

from conftest import (ENV, PY, ROOT, assert_bit_identical, cli, metrics_of, same_metrics, spec,
                      state_of, train, weights_digest)
from cifarflow.engine.checkpoints import files as ckpt
from cifarflow.job.launch import launch_argv, world_of
from cifarflow.engine.strategies.base import StrategyError
from cifarflow.engine.cuda import apply_cuda_switches
from cifarflow.engine.strategies.ddp import (dist_env, first_host, gpu_index, port_for_job,
                                     require_dist_env, shared_gpus)

COMMON = dict(epochs=2, momentum=0.9, lr=0.05)


@pytest.fixture(scope="module")
def single_2b(cifar_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "s"
    train(cifar_dir, out, spec_kw={**COMMON, "batch_size": 200})
    return out


@pytest.fixture(scope="module")
def ddp_b(cifar_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "s"
    train(cifar_dir, out, threads=1, nproc=2, spec_kw={**COMMON, "batch_size": 100,
          "strategy": "ddp", "world_size": 2, "device": "cpu"})
    return out


def close(a: dict, b: dict, tol: float) -> float:
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst < tol, f"max abs difference {worst}"
    return worst


def test_ddp_two_ranks_match_one_process_with_double_batch(single_2b, ddp_b):
    close(state_of(single_2b)["model"], state_of(ddp_b)["model"], 1e-4)
    a, b = metrics_of(single_2b), metrics_of(ddp_b)
    for x, y in zip(a, b):
        assert abs(x["train_loss"] - y["train_loss"]) < 1e-4
        assert abs(x["test_acc"] - y["test_acc"]) < 0.01
    assert all(r["world_size"] == 2 for r in b)
    assert b[-1]["images_per_sec"] == pytest.approx(2 * b[-1]["images_per_sec_per_rank"], rel=0.5)


def test_ddp_segments_resume_exactly(cifar_dir, ddp_b, tmp_path):
    kw = dict(threads=1, nproc=2, spec_kw={**COMMON, "batch_size": 100, "strategy": "ddp",
                                           "world_size": 2, "device": "cpu"})
    train(cifar_dir, tmp_path / "s1", until_epoch=1, **kw)
    train(cifar_dir, tmp_path / "s2", resume=tmp_path / "s1", **kw)
    assert_bit_identical(state_of(ddp_b)["model"], state_of(tmp_path / "s2")["model"])
    assert weights_digest(ddp_b) == weights_digest(tmp_path / "s2")  # DDP's module. unwrapped
    assert same_metrics(metrics_of(ddp_b), metrics_of(tmp_path / "s2"))


def fsdp_full_weights(directory):
    """Gather the DCP shards into one state dict (offline, no process group)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = directory.parent / (directory.name + "-full.pt")
    dcp_to_torch_save(directory / "shards", target)
    return torch.load(target, weights_only=False)["model"]


def test_fsdp_matches_ddp_and_its_sharded_checkpoint_resumes(cifar_dir, ddp_b, tmp_path):
    kw = dict(threads=1, nproc=2, spec_kw={**COMMON, "batch_size": 100, "strategy": "fsdp",
                                           "world_size": 2, "device": "cpu"})
    train(cifar_dir, tmp_path / "s1", until_epoch=1, **kw)
    m = ckpt.read_manifest(tmp_path / "s1")
    assert m["backend"] == "dcp" and any(f.startswith("shards/") for f in m["files"])
    train(cifar_dir, tmp_path / "s2", resume=tmp_path / "s1", **kw)
    fsdp = fsdp_full_weights(tmp_path / "s2")
    close(state_of(ddp_b)["model"], fsdp, 1e-4)
    whole = tmp_path / "whole"
    train(cifar_dir, whole, **kw)
    assert_bit_identical(fsdp_full_weights(whole), fsdp)
    # the digest the ranks computed over their shards is that of the gathered weights
    assert weights_digest(whole) == weights_digest(tmp_path / "s2")
    assert same_metrics(metrics_of(whole), metrics_of(tmp_path / "s2"))


BUFFER_PROBE = """
import sys, torch, torch.distributed as dist
from cifarflow.config import TrainConfig
from cifarflow.engine.strategies import get_strategy

s = get_strategy("fsdp")(TrainConfig.read(sys.argv[1]), 1)
s.setup()
model = s.wrap(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                   torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10)))
model(torch.full((2, 3, 8, 8), float(s.rank)))  # each rank sees other data
def means():
    bn = s.unwrap(model)[1]
    return [t.tolist() for t in s.gather_objects(bn.running_mean.clone())]
before = means()
s.sync_buffers(model)
after = means()
if s.is_main:
    print("before", before[0] != before[1], "after", after[0] == after[1] == before[0])
s.teardown()
"""


def test_fsdp_ranks_take_rank_0s_buffers(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(BUFFER_PROBE)
    out = cli("launch", "--nproc", 2, "--", PY, script,
              spec(strategy="fsdp", world_size=2, device="cpu"))
    assert "before True after True" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


@pytest.mark.slow  # three 2-rank runs: about 15 s; the buffer rule is in test-fast (above)
@pytest.mark.variant
def test_fsdp_with_batchnorm_resumes_exactly(cifar_dir, tmp_path, monkeypatch):
    """FSDP shards parameters only: BatchNorm's running statistics are plain per-rank
    buffers, and the sharded checkpoint keeps one copy. The ranks evaluate with rank 0's
    (as DDP does), so two segments equal one run: weights, buffers and test accuracy."""
    monkeypatch.chdir(ROOT)  # where the jobs import examples.my_model from
    kw = dict(threads=1, nproc=2, spec_kw={**COMMON, "batch_size": 100, "strategy": "fsdp",
                                           "world_size": 2, "device": "cpu",
                                           "model": "examples.my_model:small_cnn",
                                           "model_args": {"width": 8}})
    train(cifar_dir, tmp_path / "s1", until_epoch=1, **kw)
    train(cifar_dir, tmp_path / "s2", resume=tmp_path / "s1", **kw)
    train(cifar_dir, tmp_path / "whole", **kw)
    resumed, whole = fsdp_full_weights(tmp_path / "s2"), fsdp_full_weights(tmp_path / "whole")
    assert any("running_mean" in k for k in whole)
    assert_bit_identical(whole, resumed)
    assert same_metrics(metrics_of(tmp_path / "whole"), metrics_of(tmp_path / "s2"))


@pytest.mark.slow  # about 20 s; test_models trains lightning on 2 processes in test-fast
@pytest.mark.variant
def test_lightning_two_processes_beat_chance_and_resume(cifar_dir, tmp_path):
    kw = dict(threads=1, nproc=2, spec_kw={**COMMON, "epochs": 3, "batch_size": 100,
                                           "strategy": "lightning", "world_size": 2,
                                           "device": "cpu"})
    # Lightning spawns its own workers locally: launch runs the command once
    train(cifar_dir, tmp_path / "s1", until_epoch=2, **kw)
    assert ckpt.read_manifest(tmp_path / "s1")["epoch"] == 2
    train(cifar_dir, tmp_path / "s2", resume=tmp_path / "s1", **kw)
    history = metrics_of(tmp_path / "s2")
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert history[-1]["world_size"] == 2
    assert history[-1]["test_acc"] > 0.3 and history[-1]["train_loss"] < history[0]["train_loss"]
    assert ckpt.read_manifest(tmp_path / "s2")["done"]
    train(cifar_dir, tmp_path / "whole", **kw)
    assert_bit_identical(state_of(tmp_path / "whole")["model"], state_of(tmp_path / "s2")["model"])
    assert weights_digest(tmp_path / "whole") == weights_digest(tmp_path / "s2")


@pytest.mark.parametrize("strategy, extra", [
    ("gpu", {}), ("mps", {}), ("ddp", {"device": "cuda", "world_size": 1}),
    ("fsdp", {"device": "cuda", "world_size": 1}), ("lightning", {"device": "cuda", "world_size": 1})])
def test_cuda_strategies_fail_fast_with_one_clear_line(cifar_dir, tmp_path, strategy, extra):
    """Where torch sees no GPU (hidden here, so a GPU machine checks the message too)."""
    out = cli("train", "--spec", spec(strategy=strategy, **extra), "--data", cifar_dir,
              "--out", tmp_path / "o", check=False, timeout=120,
              env={**ENV, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0], out.stderr


def test_mps_wrapper_plans_a_private_daemon_then_refuses_without_gpu(tmp_path):
    env_extra = {"SLURM_TMPDIR": str(tmp_path), "SLURM_JOB_ID": "4242"}
    out = cli("mps-run", "--replicas", 4, "--dry-run", "--", "echo", "replica-started",
              env={**ENV, **env_extra})
    assert f"CUDA_MPS_PIPE_DIRECTORY={tmp_path}/nvidia-mps-4242/pipe" in out.stdout
    assert f"CUDA_MPS_LOG_DIRECTORY={tmp_path}/nvidia-mps-4242/log" in out.stdout
    assert "start: nvidia-cuda-mps-control -d" in out.stdout
    assert "stop:  echo quit | nvidia-cuda-mps-control" in out.stdout
    # no GPU visible (hidden, so a GPU machine with MPS checks the refusal too)
    real = cli("mps-run", "--replicas", 4, "--", "echo", "replica-started", check=False,
               env={**ENV, **env_extra, "CUDA_VISIBLE_DEVICES": ""})
    assert real.returncode == 2
    assert real.stderr.strip().startswith("mps: needs an NVIDIA GPU")
    assert "\nreplica-started" not in real.stdout  # the replicas never started


def test_mps_directories_follow_slurm_tmpdir_past_the_jobstep(tmp_path):
    """Inside a job command the jobstep has dropped SLURM_TMPDIR; the workflow's copy
    (CIFARFLOW_SLURM_TMPDIR) is used instead of a shared /tmp."""
    from cifarflow.job.mps_daemon import mps_dirs

    dirs = mps_dirs({"CIFARFLOW_SLURM_TMPDIR": str(tmp_path), "SLURM_JOB_ID": "7"})
    assert dirs["CUDA_MPS_PIPE_DIRECTORY"] == f"{tmp_path}/nvidia-mps-7/pipe"


def test_each_rank_finds_its_gpu_whether_it_sees_all_or_only_its_own():
    assert [gpu_index(r, 4, visible=4) for r in range(4)] == [0, 1, 2, 3]  # all of the node's
    assert [gpu_index(r, 4, visible=1) for r in range(4)] == [0, 0, 0, 0]  # --gpu-bind
    with pytest.raises(StrategyError, match="4 processes on this node but 2 GPUs"):
        gpu_index(3, 4, visible=2)
    # one GPU bound to two tasks on a host is a wrong request, whatever each task sees
    assert shared_gpus([("n1", "GPU-a"), ("n1", "GPU-b"), ("n2", "GPU-a")]) == []
    assert shared_gpus([("n1", "GPU-a"), ("n1", "GPU-a"), ("n2", "GPU-b")]) == [0, 1]


def test_deterministic_runs_set_the_cublas_workspace(monkeypatch):
    from cifarflow.config import TrainConfig

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    cfg = TrainConfig.read(spec("ddp", device="cuda", world_size=1))
    apply_cuda_switches(cfg)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own choice stays
    apply_cuda_switches(cfg)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_launcher_uses_srun_inside_slurm_and_torchrun_outside():
    cmd = ["python", "-m", "cifarflow", "train"]
    inside = launch_argv(4, cmd, nodes=2, cpus_per_task=3, environ={"SLURM_JOB_ID": "7"},
                         tasks_of=lambda job: 4)
    assert inside[:6] == ["srun", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=4",
                          "--ntasks-per-node=2", "--cpus-per-task=3"]
    assert inside[6:] == cmd
    bound = launch_argv(4, cmd, nodes=2, environ={"SLURM_JOB_ID": "7"}, tasks_of=lambda job: 4,
                        gpus_per_task=1)
    assert bound[6:] == ["--gpus-per-task=1", *cmd]  # each rank's task: its own GPU
    outside = launch_argv(2, cmd, environ={})
    assert "torch.distributed.run" in outside and "--nproc-per-node=2" in outside
    assert launch_argv(2, cmd, self_spawning=True, environ={}) == cmd
    with pytest.raises(SystemExit, match="has 4 tasks but the run needs 2"):
        launch_argv(2, cmd, environ={"SLURM_JOB_ID": "7"}, tasks_of=lambda job: 4)


def test_the_launcher_takes_the_world_from_the_spec_the_command_trains():
    """The rule's line names no world size: a run of 4 ranks on 2 nodes is launched as its
    spec says, whichever way --spec is written; without --nproc or --spec, one clear line."""
    path = spec("ddp", world_size=4, nodes=2)
    for command in (["cifarflow", "train", "--spec", str(path)], ["train", f"--spec={path}"]):
        assert world_of(command) == (4, 2)
    with pytest.raises(SystemExit, match="give --nproc, or a command with --spec"):
        world_of(["cifarflow", "train"])


def test_rank_and_master_come_from_slurm():
    env = dist_env({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
                    "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "cn[0012-0013]",
                    "SLURM_JOB_ID": "123456"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert env.master_addr == "cn0012" and env.master_port == port_for_job("123456")
    assert port_for_job("123456") != port_for_job("123457")
    assert first_host("gpu7,cn[1-3]") == "gpu7"


def test_no_launcher_fails_loudly_instead_of_a_world_of_one():
    with pytest.raises(StrategyError, match="found no launcher"):
        require_dist_env(2, environ={})
    assert require_dist_env(1, environ={}).world_size == 1


def test_world_size_mismatch_fails_loudly(cifar_dir, tmp_path):
    out = cli("launch", "--nproc", 2, "--", PY, "-m", "cifarflow", "train", "--spec",
              spec(strategy="ddp", world_size=3, device="cpu"), "--data", cifar_dir,
              "--out", tmp_path / "o", "--threads", 1, check=False, timeout=300)
    assert out.returncode != 0
    assert "started 2 processes but the run expects world_size=3" in out.stderr


def test_unresolvable_master_fails_loudly(cifar_dir, tmp_path):
    env = {**ENV, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "no-such-host.invalid",
           "MASTER_PORT": "29999"}
    out = cli("train", "--spec", spec(strategy="ddp", world_size=2, device="cpu"), "--data",
              cifar_dir, "--out", tmp_path / "o", check=False, timeout=120, env=env)
    assert out.returncode == 2 and "cannot resolve master address" in out.stderr
