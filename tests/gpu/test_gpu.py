"""The CUDA paths no CPU test reaches (issue 35), for a machine with a GPU: `pytest -m gpu
tests/gpu`, or `make gpu-check` (bench/gpu_check.py, which runs them first, then the
figures). Needs torch with CUDA and pyyaml, not snakemake. Every test skips without CUDA.

Each test runs the project's own code: the strategies' set-up, `cifarflow train` and
`cifarflow train-fused` as the segment jobs run them, the fused group in process, the NVML
reader, the MPS wrapper."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import ENV, PY, assert_bit_identical, cli, metrics_of, spec, state_of, weights_digest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def plain_config(strategy: str = "gpu", **train):
    from cifarflow.config import TrainConfig

    return TrainConfig.read(spec(strategy, **train))


def test_cuda_switches_and_the_device_come_from_the_config():
    """apply_cuda_switches sets TF32 and cuDNN's autotuner from train.*; the gpu strategy
    puts the process on the GPU CIFARFLOW_CUDA_DEVICE names."""
    from cifarflow.engine.strategies import get_strategy
    from cifarflow.engine.strategies.base import GPU_INDEX_ENV, apply_cuda_switches

    for deterministic, tf32 in ((True, False), (False, True)):
        cfg = plain_config(deterministic=deterministic, tf32_matmul=tf32, tf32_cudnn=tf32)
        apply_cuda_switches(cfg)
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.backends.cudnn.allow_tf32 is tf32
        assert torch.backends.cudnn.benchmark is (not deterministic)
    last = torch.cuda.device_count() - 1
    os.environ[GPU_INDEX_ENV] = str(last)
    try:
        strategy = get_strategy("gpu")(plain_config(), 2)
        strategy.setup()
        assert strategy.device == f"cuda:{last}"
        assert torch.cuda.current_device() == last
        strategy.teardown()
    finally:
        del os.environ[GPU_INDEX_ENV]


def test_amp_auto_resolves_from_the_real_capability_and_bf16_autocast_runs():
    """train.amp auto: bf16 on compute capability >= 8.0; under the strategy's autocast a
    matmul on CUDA computes in bfloat16."""
    from cifarflow.engine.hardware import resolve_amp
    from cifarflow.engine.strategies import get_strategy

    major, _ = torch.cuda.get_device_capability(0)
    assert resolve_amp("auto", "cuda:0") == ("bf16" if major >= 8 else "none")
    if major < 8:
        pytest.skip("bf16 autocast is emulated below compute capability 8.0")
    strategy = get_strategy("gpu")(plain_config(amp="bf16"), 2)
    strategy.setup()
    a = torch.randn(64, 64, device=strategy.device)
    with strategy.autocast():
        assert (a @ a).dtype == torch.bfloat16
    strategy.teardown()


def test_the_nvml_reader_reads_utilisation_and_memory():
    from cifarflow.engine.gpu_monitor import nvml_reader

    read, why = nvml_reader(torch.device("cuda:0"))
    assert read is not None, why
    util, mem_mb = read()
    assert 0 <= util <= 100 and mem_mb > 0


def test_two_gpu_segments_equal_one_bit_for_bit(cifar_dir, tmp_path):
    """CUDA RNG state and the device-resident data through a checkpoint: epoch 1, then
    epoch 2 from it, equals 2 epochs in one go (deterministic mode)."""
    one, first, second = tmp_path / "one", tmp_path / "first", tmp_path / "second"
    train_spec = spec("gpu", epochs=2, deterministic=True)
    common = ["--spec", train_spec, "--data", cifar_dir, "--threads", 2]
    cli("train", *common, "--out", one)
    cli("train", *common, "--out", first, "--until-epoch", 1)
    cli("train", *common, "--out", second, "--resume", first)
    assert_bit_identical(state_of(second)["model"], state_of(one)["model"])
    # hashed from the GPU tensors where published, recomputed here from state.pt
    assert weights_digest(second) == weights_digest(one)
    assert [r["train_loss"] for r in metrics_of(second)] == \
        [r["train_loss"] for r in metrics_of(one)]
    assert all(r["gpu_util_pct"] is not None for r in metrics_of(one))


def fused_configs(k: int, strategy: str = "gpu", **train) -> list:
    from cifarflow.config import with_defaults
    from cifarflow.controller.plan import build_runs

    config = with_defaults({"strategies": [strategy], "train": {"epochs": 2, "batch_size": 100,
                                                                **train},
                            "sweep": {"lr": [0.01 * (i + 1) for i in range(k)]}})
    return [run.config for run in build_runs(config).values()]


def test_a_fused_group_on_cuda_is_vmap_holds_one_copy_of_the_data_and_trains(cifar_dir):
    """On CUDA the fusion is vmap; the split is on the GPU once whatever K (the memory a
    group of 16 allocates exceeds a group of 2's by its members' weights and state, far
    less than 14 more copies of the split); over an epoch the members' losses fall."""
    from cifarflow.engine.fused_train import fused_group

    def group_memory(k: int) -> tuple[int, object]:
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        group = fused_group(fused_configs(k), cifar_dir, threads=2, say=lambda line: None)
        return torch.cuda.memory_allocated() - before, group

    two, group = group_memory(2)
    assert group.mode == "vmap" and group.fused.flat.is_cuda
    split_bytes = group.batches.split.images.numel()
    del group
    sixteen, group = group_memory(16)
    assert sixteen - two < 2 * split_bytes + 14 * 4 * 4 * group.fused.flat.shape[1]
    losses = torch.stack([group.train_step(x, y)[0] for x, y in group.batches.epoch(0)])
    assert torch.isfinite(losses).all()
    assert losses[-3:].mean() < losses[:3].mean()  # an epoch of 20 steps: the members learn


def test_fused_gpu_segments_equal_one_bit_for_bit(cifar_dir, tmp_path):
    """A fused group on CUDA (vmap, shared batch), 2 segments == 1, every member."""
    from cifarflow.layout import RunPaths

    def plan(results: Path) -> list[str]:
        names = []
        for cfg in fused_configs(2, deterministic=True):
            cfg.write(RunPaths(str(results), cfg.run).spec)
            names.append(cfg.run)
        return names

    def fused(results: Path, runs: list[str], k: int, until: int) -> None:
        cli("train-fused", "--pack", "p", "--segment", k, "--results", results, "--data",
            cifar_dir, "--until-epoch", until, "--threads", 2, "--status",
            results / f"status-{k}.json", "--members", *runs)

    runs = plan(tmp_path / "one")
    plan(tmp_path / "two")
    fused(tmp_path / "one", runs, 1, 2)
    fused(tmp_path / "two", runs, 1, 1)
    fused(tmp_path / "two", runs, 2, 2)
    for run in runs:
        assert_bit_identical(
            state_of(RunPaths(str(tmp_path / "two"), run).segment(2))["model"],
            state_of(RunPaths(str(tmp_path / "one"), run).segment(1))["model"])


def test_ddp_and_fsdp_choose_nccl_on_cuda(cifar_dir, tmp_path):
    """One rank per visible GPU (up to 2): backend auto is nccl (the run's log line says
    its strategy's settings); the runs finish."""
    ranks = min(2, torch.cuda.device_count())
    for strategy in ("ddp", "fsdp"):
        out = tmp_path / strategy
        done = cli("launch", "--nproc", ranks, "--", PY, "-m", "cifarflow", "train", "--spec",
                   spec(strategy, epochs=1, device="cuda", world_size=ranks), "--data",
                   cifar_dir, "--out", out, "--threads", 2)
        assert "'backend': 'nccl'" in done.stdout + done.stderr, done.stdout[-2000:]
        assert metrics_of(out)[-1]["world_size"] == ranks


def test_lightning_trains_on_the_gpu(cifar_dir, tmp_path):
    """Lightning with accelerator gpu, one process: it trains and the GPU is sampled."""
    out = tmp_path / "lightning"
    cli("train", "--spec", spec("lightning", epochs=1, device="cuda", world_size=1), "--data",
        cifar_dir, "--out", out, "--threads", 2)
    assert metrics_of(out)[-1]["gpu_util_pct"] is not None


@pytest.mark.skipif(not shutil.which("nvidia-cuda-mps-control"), reason="needs NVIDIA MPS")
def test_mps_run_starts_a_daemon_runs_members_side_by_side_and_stops_it(cifar_dir, tmp_path):
    """`cifarflow mps-run` starts a private MPS daemon, two one-GPU trainings share the GPU
    under it side by side, and the daemon is stopped afterwards."""
    outs = [tmp_path / f"m{i}" for i in range(2)]
    train_spec = spec("gpu", epochs=1)
    script = " & ".join(f"{PY} -m cifarflow train --spec {train_spec} --data {cifar_dir} "
                        f"--out {out} --threads 1" for out in outs) + " & wait"
    out = cli("mps-run", "--replicas", 2, "--", "bash", "-c", script, env=ENV)
    said = out.stdout + out.stderr
    assert all(metrics_of(o) for o in outs), said[-2000:]
    assert "[mps] 2 replicas on one GPU" in said and "[mps] daemon stopped" in said, said[-2000:]
