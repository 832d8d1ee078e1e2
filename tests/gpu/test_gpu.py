"""The CUDA paths no CPU test reaches (issue 35), for a machine with a GPU: `pytest -m gpu
tests/gpu`, or `make gpu-check` (bench/gpu_check.py, which runs them after the figures).
Needs torch with CUDA and pyyaml, not snakemake. Every test skips without CUDA; a test that
needs NVML (nvidia-ml-py), lightning or the MPS daemon skips, saying so, without it (the
check counts such a skip as a failure: bench/gpu_bundle brings nvidia-ml-py).

Each test runs the project's own code: the strategies' set-up, `cifarflow train` and
`cifarflow train-fused` as the segment jobs run them, the fused group in process, the NVML
reader, the MPS wrapper, the augmentation's draws."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import ENV, PY, assert_bit_identical, cli, metrics_of, spec, state_of, weights_digest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def needs(module: str, what: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {what}")


NVML = needs("pynvml", "nvidia-ml-py (NVML)")
LIGHTNING = needs("lightning", "lightning")


def plain_config(strategy: str = "gpu", **train):
    from cifarflow.config import TrainConfig

    return TrainConfig.read(spec(strategy, **train))


def test_cuda_switches_and_the_device_come_from_the_config():
    """apply_cuda_switches sets TF32 and cuDNN's autotuner from train.*; the gpu strategy
    puts the process on the GPU CIFARFLOW_CUDA_DEVICE names."""
    from cifarflow.engine.strategies import get_strategy
    from cifarflow.engine.cuda import GPU_INDEX_ENV, apply_cuda_switches

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


@NVML
def test_the_nvml_reader_reads_utilisation_and_memory_while_the_gpu_works():
    """The reader answers, and the sampler a run's metrics use sees the GPU busy."""
    from cifarflow.engine.gpu_monitor import GpuSampler, nvml_reader

    read, why = nvml_reader(torch.device("cuda:0"))
    assert read is not None, why
    util, mem_mb = read()
    assert 0 <= util <= 100 and mem_mb > 0
    sampler = GpuSampler(read, interval_s=0.05).start()
    sampler.take()
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(200):
        a = (a @ a).tanh_()
    torch.cuda.synchronize()
    busy = sampler.take()
    sampler.stop()
    assert busy["gpu_samples"] >= 2 and busy["gpu_util_pct"] > 0


def test_augmentation_draws_and_images_are_the_same_on_the_gpu():
    """The flip and crop draws made on the GPU equal the CPU's, and so do the images."""
    from cifarflow.engine.augment import apply, draws

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=gen)
    d = draws(64, 1, 2, 3, 1, flip=True, crop=4)
    on_gpu = draws(64, 1, 2, 3, 1, flip=True, crop=4, device="cuda")
    assert torch.equal(on_gpu.shift.cpu(), d.shift) and torch.equal(on_gpu.flip.cpu(), d.flip)
    on_device = x.cuda().contiguous(memory_format=torch.channels_last)
    assert torch.equal(apply(on_device, on_gpu).cpu(), apply(x, d))


@pytest.mark.parametrize("seeds", [[0], [0, 1]], ids=["shared-batch", "own-batches"])
def test_an_augmented_fused_step_waits_for_the_host_nowhere(cifar_dir, seeds):
    """Augmented members (flip and crop 4, resnet18's recipe) fused on CUDA: the epoch's
    draws are made at its first batch and copied from pinned memory without blocking, so
    neither a step's batch (gather, augmentation, normalisation) nor the step itself
    (forward, loss, backward, update) synchronizes with the host:
    ``torch.cuda.set_sync_debug_mode("error")`` raises at the first call that would."""
    from cifarflow.config import with_defaults
    from cifarflow.controller.plan import build_runs
    from cifarflow.engine.fused.train import fused_group

    config = with_defaults({"strategies": ["gpu"], "train": {
        "epochs": 2, "batch_size": 100, "augment": {"flip": True, "crop": 4}},
        "sweep": {"lr": [0.05, 0.06], "seed": seeds}})
    group = fused_group([run.config for run in build_runs(config).values()], cifar_dir,
                        threads=2, say=lambda line: None)
    assert group.mode == "vmap" and group.batches.shared is (len(seeds) == 1)
    batches = group.batches.epoch(0)
    for _ in range(2):  # the epoch's draws made, cuDNN's algorithms chosen
        group.train_step(*next(batches))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            losses, hits = group.train_step(*next(batches))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(losses).all() and losses.shape == hits.shape == (len(seeds) * 2,)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
def test_a_resumed_adam_step_waits_for_the_host_nowhere(tmp_path, foreach):
    """Adam on the GPU, saved and resumed through the strategy's checkpointer: its ``step``
    stays on the CPU (where torch keeps it for a non-fused Adam), so the resumed step does
    not read it back from the GPU (issue 58: ~20 syncs a step for lenet when it was mapped
    onto the device). ``set_sync_debug_mode("error")`` raises at the first sync."""
    from cifarflow.engine.models import build_model
    from cifarflow.engine.strategies import get_strategy

    strategy = get_strategy("gpu")(plain_config(optimizer="adam"), 2)
    strategy.setup()
    x = torch.randn(64, 3, 32, 32, device=strategy.device)
    y = torch.randint(0, 10, (64,), device=strategy.device)

    def step(model, optimizer):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def built():
        model = build_model("lenet").to(strategy.device)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)

    model, optimizer = built()
    step(model, optimizer)
    checkpointer = strategy.checkpointer()
    checkpointer.save(tmp_path / "ckpt", {"model": strategy.model_state(model), "optimizer":
                                         strategy.optimizer_state(model, optimizer),
                                         "trainer": {}}, {}, {})
    model, optimizer = built()
    state = checkpointer.load(tmp_path / "ckpt", {})
    strategy.load_model_state(model, state["model"])
    strategy.load_optimizer_state(model, optimizer, state["optimizer"])
    assert {s["step"].device.type for s in optimizer.state.values()} == {"cpu"}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(model, optimizer)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    strategy.teardown()


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


def fused_configs(k: int, strategy: str = "gpu", **train) -> list:
    """K runs that differ in lr only, from a moderate 0.05 up (0.001 apart)."""
    from cifarflow.config import with_defaults
    from cifarflow.controller.plan import build_runs

    config = with_defaults({"strategies": [strategy], "train": {"epochs": 2, "batch_size": 100,
                                                                **train},
                            "sweep": {"lr": [round(0.05 + 0.001 * i, 4) for i in range(k)]}})
    return [run.config for run in build_runs(config).values()]


def test_a_fused_group_on_cuda_is_vmap_holds_one_copy_of_the_data_and_trains_as_alone(
        cifar_dir):
    """On CUDA the fusion is vmap; the split is on the GPU once whatever K (the memory a
    group of 16 allocates exceeds a group of 2's by its members' weights and state, far
    less than 14 more copies of the split). Over an epoch (20 steps) its first member's
    losses follow the same run trained alone (a group of one in loop fusion: its own module,
    the kernels of a run alone) at lr 0.05, and fall. TF32 is off in both: a grouped
    convolution and K plain ones then differ by float32 rounding only (~1e-6 relative per
    step), which 20 steps of SGD leave far below the 1e-3 allowed; TF32's 10-bit mantissa
    would differ by ~1e-3 per product and leave no tolerance to reason with."""
    from cifarflow.engine.fused.train import fused_group

    exact = {"deterministic": True, "tf32_matmul": False, "tf32_cudnn": False}

    def group_memory(k: int) -> tuple[int, object]:
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        group = fused_group(fused_configs(k, **exact), cifar_dir, threads=2,
                            say=lambda line: None)
        return torch.cuda.memory_allocated() - before, group

    two, group = group_memory(2)
    assert group.mode == "vmap" and group.fused.flat.is_cuda
    split_bytes = group.batches.split.images.numel()
    del group
    sixteen, group = group_memory(16)
    assert sixteen - two < 2 * split_bytes + 14 * 4 * 4 * group.fused.flat.shape[1]
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    losses = torch.stack([group.train_step(x, y)[0] for x, y in group.batches.epoch(0)])
    alone = fused_group(fused_configs(1, **exact), cifar_dir, threads=2, mode="loop",
                        say=lambda line: None)
    assert alone.members[0].cfg.lr == group.members[0].cfg.lr == 0.05
    alone_losses = torch.stack([alone.train_step(x, y)[0] for x, y in alone.batches.epoch(0)])
    assert torch.isfinite(losses).all()
    torch.testing.assert_close(losses[:, 0], alone_losses[:, 0], rtol=1e-3, atol=1e-4)
    assert losses[-3:].mean() < losses[:3].mean()  # the members learn


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


@LIGHTNING
@NVML
def test_lightning_trains_on_the_gpu(cifar_dir, tmp_path):
    """Lightning with accelerator gpu, one process: it trains and the GPU is sampled."""
    out = tmp_path / "lightning"
    cli("train", "--spec", spec("lightning", epochs=1, device="cuda", world_size=1), "--data",
        cifar_dir, "--out", out, "--threads", 2)
    assert metrics_of(out)[-1]["gpu_util_pct"] is not None


@pytest.mark.skipif(not shutil.which("nvidia-cuda-mps-control"), reason="needs NVIDIA MPS")
def test_mps_run_starts_a_daemon_runs_members_side_by_side_and_stops_it(cifar_dir, tmp_path):
    """`cifarflow mps-run` starts a private MPS daemon, two one-GPU trainings share the GPU
    under it side by side, each exits 0, and the daemon is stopped afterwards."""
    outs = [tmp_path / f"m{i}" for i in range(2)]
    train_spec = spec("gpu", epochs=1)
    starts = "".join(f"{PY} -m cifarflow train --spec {train_spec} --data {cifar_dir} "
                     f"--out {out} --threads 1 & pids+=($!); " for out in outs)
    script = (f"pids=(); {starts}codes=(); for p in ${{pids[@]}}; do wait $p; codes+=($?); "
              "done; echo \"member exits: ${codes[*]}\"; for c in ${codes[@]}; do "
              "[ $c = 0 ] || exit 1; done")
    out = cli("mps-run", "--replicas", 2, "--", "bash", "-c", script, env=ENV, check=False)
    said = out.stdout + out.stderr
    assert re.search(r"member exits: 0 0$", out.stdout, re.M), said[-2000:]
    assert out.returncode == 0, said[-2000:]
    assert all(metrics_of(o) for o in outs), said[-2000:]
    assert "[mps] 2 replicas on one GPU" in said and "[mps] daemon stopped" in said, said[-2000:]
