"""What a cluster's documentation says and Slurm does not tell: whether a job may submit
jobs, the shortest walltime the site accepts, and which of the user's file systems are
read-only on its compute nodes. One small table of the Alliance sites whose rules differ
from the by-core default, found by ``CC_CLUSTER`` (set on every Alliance login and compute
node); anywhere else, the default: jobs may submit jobs, no minimum, nothing read-only.
No torch here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Site:
    name: str = ""                         # CC_CLUSTER; "" where the site is not in the table
    jobs_may_submit: bool = True           # sbatch works inside a job
    min_runtime: int = 0                   # minutes: a shorter walltime is refused
    read_only_on_nodes: tuple[str, ...] = ()  # environment variables of read-only folders
    docs: str = ""                         # where the rules above are written

    def runtime_floor(self, minutes: int) -> int:
        """A runtime the workflow sets itself (autosize's floor, the environment record's),
        raised to the site's minimum."""
        return max(int(minutes), self.min_runtime)

    def too_short(self, minutes: int, what: str) -> str | None:
        """The refusal of a runtime the user set below the site's minimum, or None."""
        if int(minutes) >= self.min_runtime:
            return None
        return (f"{what}: {minutes} minutes is under {self.name}'s minimum walltime of "
                f"{self.min_runtime} minutes ({self.docs}), which Slurm there refuses: set "
                f"{what}: {self.min_runtime} or more")


TRILLIUM_DOCS = "https://docs.alliancecan.ca/wiki/Trillium_Quickstart"
SITES = {
    # whole nodes only, jobs cannot submit jobs, $HOME and $PROJECT read-only on the
    # compute nodes, 15 minutes to 24 hours per job (its quickstart page)
    "trillium": Site("trillium", jobs_may_submit=False, min_runtime=15,
                     read_only_on_nodes=("HOME", "PROJECT"), docs=TRILLIUM_DOCS),
}


def current(environ=os.environ) -> Site:
    """This cluster's rules, by CC_CLUSTER; the default Site where it is not in the table."""
    return SITES.get(environ.get("CC_CLUSTER", "").strip().lower(), Site())


def read_only_folder(path, site: Site, environ=os.environ) -> str | None:
    """The variable (e.g. HOME) of the site's read-only-on-nodes folder ``path`` is in,
    or None."""
    where = Path(path).resolve()
    for name in site.read_only_on_nodes:
        folder = Path(environ[name]).resolve() if environ.get(name) else None
        if folder and (where == folder or folder in where.parents):
            return name
    return None
