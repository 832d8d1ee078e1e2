"""One CUDA device: pinned host memory, non-blocking copies, TF32 switches, optional
torch.compile and bf16 autocast (the seed's "Travailler avec un GPU")."""

from .base import Strategy


class GPUStrategy(Strategy):
    name = "gpu"
    device_kind = "cuda"
