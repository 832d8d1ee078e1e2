"""Clear GPU errors, on CPU with the GPU count injected: ddp with more ranks than GPUs
outside Slurm is one line before NCCL starts, and at `snakemake -n` of a local run; and the
GPU sampler records every epoch, however short (a fake NVML reader)."""

import pytest

from cifarflow.engine.gpu_monitor import GpuSampler
from cifarflow.engine.strategies.base import StrategyError
from cifarflow.engine.strategies.ddp import gpu_index
from test_workflow_plan import bin_dir, make_plan  # noqa: F401

ONE_LINE = ("ddp: 4 ranks on this machine need a GPU each, but 1 GPU(s) visible: NCCL cannot "
            "put two ranks on one GPU; use strategy mps for replicas sharing one GPU (NVIDIA "
            "MPS), or set distributed.world_size to at most 1")


def test_more_ranks_than_gpus_outside_slurm_is_one_line():
    with pytest.raises(StrategyError) as info:
        gpu_index(0, 4, visible=1, slurm=False, strategy="ddp")  # torchrun, 1 GPU
    assert str(info.value) == ONE_LINE
    assert [gpu_index(r, 2, visible=2, slurm=False) for r in range(2)] == [0, 1]
    # under srun a task that sees one GPU was bound to it (--gpu-bind): GPU 0 is its own
    assert gpu_index(3, 4, visible=1, slurm=True) == 0


def ddp_plan(tmp_path, bin_dir, **kw):
    return make_plan(tmp_path, bin_dir, strategies=["ddp", "mps", "gpu"],
                     distributed={"world_size": 4, "nodes": 1, "device": "cuda"},
                     mps={"replicas": 4}, **kw)


def test_the_dry_run_of_a_local_run_says_it_when_nvidia_smi_counts_too_few(tmp_path, bin_dir):
    plan = ddp_plan(tmp_path, bin_dir)
    plan.checks.local_gpus(count_gpus=lambda: 1, environ={})
    assert plan.log.warnings == [
        f"WARNING: run ddp: {ONE_LINE} (nvidia-smi -L; a local run stops there, before NCCL "
        "starts; under profiles/slurm each rank gets a GPU of its own)"]  # not mps, not gpu
    sweep = ddp_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2, 0.3]})
    sweep.checks.local_gpus(count_gpus=lambda: 1, environ={})
    (line,) = sweep.log.warnings
    assert line.startswith(f"WARNING: run ddp_lr0p1 (and 2 more alike): {ONE_LINE} (")
    for count, environ, jobs in ((4, {}, None), (None, {}, None),  # enough; no GPU tools
                                 (1, {"SLURM_JOB_ID": "7"}, None),  # srun binds GPUs
                                 (1, {}, 8)):  # --jobs: profiles/slurm submits
        quiet = ddp_plan(tmp_path, bin_dir, jobs_at_once=jobs)
        quiet.checks.local_gpus(count_gpus=lambda: count, environ=environ)
        assert quiet.log.warnings == [], (count, environ, jobs)


def test_no_gpu_count_is_asked_where_no_run_needs_several(tmp_path, bin_dir):
    def never():
        raise AssertionError("nvidia-smi asked")

    plan = make_plan(tmp_path, bin_dir, strategies=["cpu", "gpu"])
    plan.checks.local_gpus(count_gpus=never, environ={})
    assert plan.log.warnings == []


class FakeNvml:
    """NVML as the sampler reads it: (utilisation %, memory MB), one reading per call."""

    def __init__(self, readings):
        self.readings, self.calls = list(readings), 0

    def __call__(self):
        self.calls += 1
        return self.readings.pop(0)


def test_an_epoch_shorter_than_the_sampling_interval_gets_a_reading():
    nvml = FakeNvml([(10.0, 100.0), (90.0, 900.0), (40.0, 400.0), (10.0, 100.0)])
    sampler = GpuSampler(nvml, interval_s=3600).start()  # the thread never reads in time
    try:
        sampler.take()  # the epoch starts: what came before is dropped
        # a 0.18 s epoch, as mps with 4 replicas trains the seed's lenet
        assert sampler.take() == {"gpu_util_pct": 90.0, "gpu_mem_mb": 900.0, "gpu_samples": 1}
        sampler.sample()  # the thread's reading during a longer epoch, then its end's
        assert sampler.take() == {"gpu_util_pct": 25.0, "gpu_mem_mb": 400.0, "gpu_samples": 2}
    finally:
        sampler.stop()
    assert nvml.calls == 4


def test_a_failed_reading_loses_one_sample_never_the_run():
    def broken():
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    sampler = GpuSampler(broken, interval_s=3600).start()
    try:
        assert sampler.take() == {"gpu_util_pct": None, "gpu_mem_mb": None, "gpu_samples": 0}
    finally:
        sampler.stop()

