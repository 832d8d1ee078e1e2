"""What the test cluster (tests/slurm/cluster.sh) gives its user, as an Alliance site would:
the accounts, and the environment a user's ~/.bashrc sets (Alliance's docs: export
SLURM_ACCOUNT). Every workflow the Slurm tests run sees SLURM_ACCOUNT=def-cifar, which the
plan maps to def-cifar_cpu or def-cifar_gpu per job; a direct sbatch names one of those."""

from conftest import ENV

ACCOUNT = "def-cifar"           # what a user types (slurm.account or $SLURM_ACCOUNT)
CPU_ACCOUNT = f"{ACCOUNT}_cpu"  # what the site's submit plugin takes for CPU jobs
GPU_ACCOUNT = f"{ACCOUNT}_gpu"  # and for GPU jobs

ENV["SLURM_ACCOUNT"] = ACCOUNT  # the runs of this pytest process (the Slurm half alone)
