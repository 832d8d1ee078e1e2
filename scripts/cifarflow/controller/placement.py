"""Where each job goes in Slurm: the config's slurm.account, slurm.partition and slurm.extra
(else the user's $SLURM_ACCOUNT and $SLURM_PARTITION; absent means the cluster's default),
and the account a CPU or a GPU job goes to once the main process settled it against
sacctmgr (accounts.py: def-pi -> def-pi_cpu / def-pi_gpu). No torch."""

from __future__ import annotations

import os


def slurm_placement(slurm: dict, environ=os.environ) -> dict:
    """slurm_account / slurm_partition / slurm_extra for every job, as the config and the
    environment give them."""
    res = {}
    for key in ("account", "partition"):
        value = slurm[key] or environ.get(f"SLURM_{key.upper()}", "")
        if value:
            res[f"slurm_{key}"] = value
    if slurm["extra"]:
        res["slurm_extra"] = slurm["extra"]
    return res


class Placement:
    """The placement of every job, and the account of a job by whether it asks GPUs."""

    def __init__(self, slurm: dict, environ=os.environ):
        self.given = slurm_placement(slurm, environ)
        self.accounts: dict | None = None  # {on GPUs: account}: the main process's check

    def for_job(self, gpu: bool) -> dict:
        account = (self.accounts or {}).get(gpu)
        return {**self.given, **({"slurm_account": account} if account else {})}
