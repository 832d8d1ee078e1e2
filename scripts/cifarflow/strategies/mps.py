"""Several DDP replicas sharing one GPU through NVIDIA MPS (the seed's "un seul GPU").

The job runs under ``cifarflow mps-run``, which starts a private MPS control daemon and
stops it afterwards. NCCL refuses several ranks on one GPU, so ranks talk over gloo."""

from .base import apply_cuda_switches, require_cuda
from .ddp import DDPStrategy


class MPSStrategy(DDPStrategy):
    name = "mps"
    config_sections = ("mps",)
    sweep_keys = {"replicas": ("rep", "mps")}
    gpu_per_rank = False  # the replicas share one GPU

    @classmethod
    def world_size(cls, sections):
        return int(sections["mps"]["replicas"])

    @classmethod
    def process_settings(cls, sections):
        return {"nodes": 1, "device": "cuda", "backend": "gloo",
                "lr_scaling": sections["distributed"]["lr_scaling"]}

    @classmethod
    def gpus_per_node(cls, cfg):
        return 1  # every replica on the same GPU

    @classmethod
    def command_prefix(cls, python, run):
        return (f"{python} -m cifarflow mps-run --replicas {run.config.world_size} -- "
                f"{cls.launcher(python, run)}")

    def backend(self, cuda):
        return "gloo"

    def pick_device(self, env):
        import torch

        require_cuda(self.name)
        apply_cuda_switches(self.cfg)
        torch.cuda.set_device(0)
        return "cuda:0"
