"""One CUDA device: pinned host memory, non-blocking copies, TF32 switches, optional
torch.compile and bf16 autocast (the seed's "Travailler avec un GPU")."""

from .base import Strategy, StrategyError


def require_cuda(strategy: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise StrategyError(f"strategy '{strategy}' needs a CUDA GPU but none is visible "
                            "(torch.cuda.is_available() is False): run it on a GPU node "
                            "(profiles/slurm requests one) or choose cpu/ddp in config")


def apply_cuda_switches(cfg) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32_matmul
    torch.backends.cudnn.allow_tf32 = cfg.tf32_cudnn
    torch.backends.cudnn.benchmark = not cfg.deterministic


class GPUStrategy(Strategy):
    name = "gpu"

    @classmethod
    def job_resources(cls, world_size, res):
        out = super().job_resources(world_size, res)
        out.update(gpu=1, tasks_per_gpu=0)  # tasks_per_gpu=0: one command, not one per GPU
        if res.get("gpu_model"):
            out["gpu_model"] = res["gpu_model"]
        return out

    def setup(self):
        super().setup()
        require_cuda(self.name)
        import torch

        self.device = f"cuda:{torch.cuda.current_device()}"
        apply_cuda_switches(self.cfg)
