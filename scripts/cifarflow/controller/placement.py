"""Where each job goes in Slurm: the config's slurm.account, slurm.partition and slurm.extra
(else the user's $SLURM_ACCOUNT and $SLURM_PARTITION; absent means the cluster's default),
the account a CPU or a GPU job goes to once the main process settled it against
sacctmgr (accounts.py: def-pi -> def-pi_cpu / def-pi_gpu), and a job's GPUs as sbatch gets
them: typed, in the form Alliance documents (--gpus-per-node=h100:1; --gres for GPUs is
deprecated there), the type the nodes have where resources.gpu_model names none
(gpu_types.py). No torch."""

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


def joined(*options) -> str:
    """sbatch options of several sources as one slurm_extra."""
    return " ".join(filter(None, options))


class Placement:
    """The placement of every job, the account of a job by whether it asks GPUs, and the
    option that asks its GPUs."""

    def __init__(self, slurm: dict, environ=os.environ, gpu_model: str = ""):
        self.given = slurm_placement(slurm, environ)
        self.accounts: dict | None = None  # {on GPUs: account}: the main process's check
        self.gpu_model = gpu_model  # resources.gpu_model: "" the nodes' type, any, or a type
        self.gpu_type = ""  # the nodes' type where gpu_model is "": the main process's check

    def for_job(self, gpu: bool) -> dict:
        account = (self.accounts or {}).get(gpu)
        return {**self.given, **({"slurm_account": account} if account else {})}

    def gpus(self, gres: str) -> str:
        """The sbatch option of a request's gres (gpu:<n> or gpu:<type>:<n>): typed with the
        request's type, else the nodes' (settled) unless resources.gpu_model is any."""
        parts = gres.split(":")
        model = parts[1] if len(parts) == 3 else ("" if self.gpu_model else self.gpu_type)
        return f"--gpus-per-node={model + ':' if model else ''}{parts[-1]}"

    def job(self, own: dict) -> dict:
        """A job's resources as the Slurm plugin takes them: its own request, its GPUs (a
        gres) as --gpus-per-node in slurm_extra, its placement (account by GPUs or not)."""
        own = dict(own)
        gres = own.pop("gres", "")
        own.pop("tasks_per_gpu", None)  # the plugin's --ntasks-per-gpu goes with gres alone
        placement = self.for_job(bool(gres))
        extra = joined(own.get("slurm_extra"), self.gpus(gres) if gres else "",
                       placement.get("slurm_extra"))
        return {**own, **placement, **({"slurm_extra": extra} if extra else {})}
