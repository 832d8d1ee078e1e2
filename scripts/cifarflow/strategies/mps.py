"""Several DDP replicas sharing one GPU through NVIDIA MPS (the seed's "un seul GPU").

The job runs under ``cifarflow mps-run``, which starts a private MPS control daemon and
stops it afterwards. NCCL refuses several ranks on one GPU, so ranks talk over gloo
(or mpi, as the seed does)."""

from .base import StrategyError
from .ddp import DDPStrategy


class MPSStrategy(DDPStrategy):
    name = "mps"

    @classmethod
    def job_resources(cls, world_size, res):
        out = {"nodes": 1, "tasks": world_size, "cpus_per_task": int(res["cpus_per_task"]),
               "mem_mb": int(res["mem_mb"]), "gpu": 1, "tasks_per_gpu": 0}
        if res.get("gpu_model"):
            out["gpu_model"] = res["gpu_model"]
        return out

    def backend(self, cuda):
        if self.cfg.backend == "nccl":
            raise StrategyError("mps: nccl cannot run several ranks on one GPU; use gloo or mpi")
        return "gloo" if self.cfg.backend == "auto" else self.cfg.backend

    def pick_device(self, env):
        import torch

        from .gpu import apply_cuda_switches, require_cuda

        require_cuda(self.name)
        apply_cuda_switches(self.cfg)
        torch.cuda.set_device(0)
        return "cuda:0"

    def wrap(self, model):
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(super(DDPStrategy, self).wrap(model), device_ids=[0])
