"""cifarflow: one training engine for CIFAR-10 on Slurm, called by the Snakemake rules."""

__version__ = "0.1.0"
