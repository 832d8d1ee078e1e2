"""CUDA as a strategy meets it: the GPUs a job asks the scheduler for (Snakemake's gres,
read at plan time), why a process that needs a GPU sees none, the switches set before any
CUDA work (TF32, cuDNN's autotuner, cuBLAS's workspace), and the GPU a member of an
MPS-shared pack was given. Torch inside functions only: the controller reads gpu_request."""

from __future__ import annotations

import os

# the GPU index of a one-process run whose GPUs are shared (an MPS-shared pack's member)
GPU_INDEX_ENV = "CIFARFLOW_CUDA_DEVICE"


def gpu_request(model: str, gpus: int) -> dict:
    """Snakemake resources for `gpus` GPUs per node, of `model` if given ("" or "any": the
    controller's placement types it, or not: controller/placement.py); tasks_per_gpu=0: the
    Slurm plugin must not start the command once per GPU."""
    typed = model and model != "any"
    return {"gres": f"gpu:{model}:{gpus}" if typed else f"gpu:{gpus}", "tasks_per_gpu": 0}


def cuda_missing(strategy: str) -> str:
    """Why ``strategy`` cannot train here ("" where a CUDA GPU is visible)."""
    import torch

    if torch.cuda.is_available():
        return ""
    return (f"strategy '{strategy}' needs a CUDA GPU but none is visible "
            "(torch.cuda.is_available() is False): run it on a GPU node "
            "(profiles/slurm requests one) or choose cpu/ddp in config")


def apply_cuda_switches(cfg) -> None:
    """Before any CUDA work: cuBLAS reads its workspace setting when it starts."""
    import torch

    if cfg.deterministic:  # reproducible cuBLAS results (else a warning and drift)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32_matmul
    torch.backends.cudnn.allow_tf32 = cfg.tf32_cudnn
    torch.backends.cudnn.benchmark = not cfg.deterministic


def use_assigned_gpu() -> str:
    """This process's device: the GPU its place in an MPS-shared pack names (GPU_INDEX_ENV),
    else the current one."""
    import torch

    if os.environ.get(GPU_INDEX_ENV):
        torch.cuda.set_device(int(os.environ[GPU_INDEX_ENV]))
    return f"cuda:{torch.cuda.current_device()}"
