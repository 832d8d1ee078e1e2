"""Will the plan fit the filesystem under results:? Its free bytes and inodes (statvfs of
the nearest existing folder) and, where Lustre's ``lfs`` is installed (Alliance's /home,
/project, /scratch), the quota that holds there: the user's (``lfs quota -q -u $USER``) in
/home and /scratch; in a project space (/project/def-pi, Alliance's per-group space) the
group's that owns the folder (``-g def-pi``) and its Lustre project id's where the folder
has one (``lfs project -d``, then ``-p ID``), the user's counting nothing there. Against
what storage.estimate counts: refused when it cannot fit, a warning above WARN_SHARE of it.
No torch here."""

from __future__ import annotations

import grp
import os
import re
import shutil
from pathlib import Path

from .. import slurm
from .storage import Estimate, gb

WARN_SHARE = 0.8  # a plan above this share of what is free is warned about
# a project space: /project/..., or where Alliance's /project/def-pi links to (/lustre03/project/)
PROJECT_SPACE = re.compile(r"^/(?:[^/]+/)?project/")


def nearest_folder(path: str) -> Path:
    """The folder itself, or its nearest parent that exists (results/ may not yet)."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    return where


def parse_lfs_quota(text: str) -> dict | None:
    """Free bytes and files under the user's Lustre quota (``lfs quota -q -u USER PATH``:
    filesystem, kbytes, quota, limit, grace, files, quota, limit, grace; the filesystem
    may stand on a line of its own); None for a limit that is not set (0)."""
    tokens = text.split()
    if len(tokens) < 9:
        return None
    _, used_kb, soft_kb, hard_kb, _, used_files, soft_files, hard_files, _ = tokens[:9]

    def left(used: str, soft: str, hard: str, unit: int) -> int | None:
        limit = int(hard.rstrip("*")) or int(soft.rstrip("*"))
        return max(0, limit - int(used.rstrip("*"))) * unit if limit else None

    try:
        return {"bytes": left(used_kb, soft_kb, hard_kb, 1024),
                "inodes": left(used_files, soft_files, hard_files, 1)}
    except ValueError:  # an answer of another shape: say nothing of it
        return None


def in_project_space(where: Path) -> bool:
    """Whether the folder is in a project space (PROJECT_SPACE), as written or resolved."""
    return any(PROJECT_SPACE.match(f"{p}/") for p in (where.absolute(), where.resolve()))


def group_of(where: Path) -> str:
    """The group owning the folder (its name, else its id: lfs takes either)."""
    gid = where.stat().st_gid
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def project_id(where: Path, lfs: str) -> str:
    """The folder's Lustre project id (``lfs project -d``: "  4567 P /path"), "" for none (0)."""
    reply = slurm.ask([lfs, "project", "-d", str(where)])
    first = reply.stdout.split()[:1] if reply.ok else []
    return first[0] if first and first[0].isdigit() and int(first[0]) else ""


def quota_asks(where: Path, user: str, lfs: str) -> list[list[str]]:
    """The ``lfs quota`` questions whose limits hold in the folder: the user's, or in a
    project space the owning group's and the folder's project id's."""
    if not in_project_space(where):
        return [[lfs, "quota", "-q", "-u", user or slurm.user(), str(where)]]
    asks = [[lfs, "quota", "-q", "-g", group_of(where), str(where)]]
    project = project_id(where, lfs)
    return asks + ([[lfs, "quota", "-q", "-p", project, str(where)]] if project else [])


def room(path: str, user: str = "", lfs=None) -> dict:
    """What the filesystem under ``path`` still takes: {"path", "bytes", "inodes",
    "quota": the Lustre quota that is the tighter part ("-g def-pi"), else False}."""
    where = nearest_folder(path)
    stat = os.statvfs(where)
    found = {"path": str(where), "bytes": stat.f_bavail * stat.f_frsize,
             "inodes": stat.f_favail if stat.f_files else None, "quota": False}
    lfs = shutil.which("lfs") if lfs is None else lfs
    for argv in quota_asks(where, user, lfs) if lfs else []:
        reply = slurm.ask(argv)
        quota = parse_lfs_quota(reply.stdout) if reply.ok else None
        for key in ("bytes", "inodes"):
            if quota and quota[key] is not None and (found[key] is None or quota[key] < found[key]):
                found[key], found["quota"] = quota[key], " ".join(argv[3:5])
    return found


def check_room(est: Estimate, keep_weights: str, space: dict) -> tuple[str | None, str | None]:
    """(a refusal, a warning): the plan against the room under results:."""
    need, inodes = est.bytes(keep_weights), est.inodes
    free, free_inodes = space["bytes"], space["inodes"]
    how = f"lfs quota {space['quota']}" if space["quota"] else "statvfs"
    where = f"{space['path']} ({how}: " \
            f"{gb(free)} and {'?' if free_inodes is None else f'{free_inodes:,}'} files free)"
    over = [f"~{gb(need)}" if need > free else "",
            f"~{inodes:,} files and folders" if free_inodes is not None and inodes > free_inodes
            else ""]
    over = [o for o in over if o]
    ways = []
    if keep_weights != "last" and est.bytes("last") < need:
        ways.append(f"segments.keep_weights: last (~{gb(est.bytes('last'))})")
    ways.append("results: on a larger filesystem (/scratch/$USER/<sweep> on Alliance; "
                "docs/slurm.md)")
    if over:
        return (f"storage: the plan needs {' and '.join(over)} under results:, more than "
                f"{where} has: it would fail mid-sweep; set {', or '.join(ways)}"), None
    share = max(need / free if free else 1.0,
                inodes / free_inodes if free_inodes else 0.0)
    if share > WARN_SHARE:
        return None, (f"storage: the plan takes {share:.0%} of what {where} has left; "
                      f"consider {', or '.join(ways)}")
    return None, None
