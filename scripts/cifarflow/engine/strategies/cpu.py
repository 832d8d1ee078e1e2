"""One process on CPU cores: intra-op threads from SLURM_CPUS_PER_TASK (the seed's advice)."""

from .base import Strategy


class CPUStrategy(Strategy):
    name = "cpu"
