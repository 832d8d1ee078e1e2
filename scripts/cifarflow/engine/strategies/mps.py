"""Replicas sharing one GPU through NVIDIA MPS (the seed's "un seul GPU"): DDP's processes,
process group and wrapping, with another count and placement. ``mps.replicas`` processes
on one node, all on GPU 0, over gloo (NCCL refuses several ranks on one GPU). Their
lr_scaling is ``distributed.lr_scaling``, the one rule for N replicas; the world_size
sweep does not apply (replicas is theirs).

The job runs under ``cifarflow mps-run``, which starts a private MPS control daemon and
stops it afterwards."""

from .ddp import DDPStrategy


class MPSStrategy(DDPStrategy):
    name = "mps"
    config_sections = ("mps",)
    sweep_keys = {"replicas": ("rep", "mps")}
    processes_from = "mps.replicas"
    fixed_settings = {"nodes": 1, "device": "cuda", "backend": "gloo"}
    gpu_per_rank = False  # the replicas share one GPU

    @classmethod
    def command_prefix(cls, python, run):
        return (f"{python} -m cifarflow mps-run --replicas {run.config.world_size} -- "
                f"{cls.launcher(python, run)}")
