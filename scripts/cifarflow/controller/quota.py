"""Will the plan fit the filesystem under results:? Its free bytes and inodes (statvfs of
the nearest existing folder) and, where Lustre's ``lfs`` is installed (Alliance's /home,
/project, /scratch), the user's quota there (``lfs quota -q -u $USER``), against what
storage.estimate counts. Refused when it cannot fit, a warning above WARN_SHARE of it.
No torch here."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .. import slurm
from .storage import Estimate, gb

WARN_SHARE = 0.8  # a plan above this share of what is free is warned about


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


def room(path: str, user: str = "", lfs=None) -> dict:
    """What the filesystem under ``path`` still takes: {"path", "bytes", "inodes",
    "quota": whether a Lustre quota is the tighter part}."""
    where = nearest_folder(path)
    stat = os.statvfs(where)
    found = {"path": str(where), "bytes": stat.f_bavail * stat.f_frsize,
             "inodes": stat.f_favail if stat.f_files else None, "quota": False}
    lfs = shutil.which("lfs") if lfs is None else lfs
    if lfs:
        reply = slurm.ask([lfs, "quota", "-q", "-u", user or slurm.user(), str(where)])
        quota = parse_lfs_quota(reply.stdout) if reply.ok else None
        for key in ("bytes", "inodes"):
            if quota and quota[key] is not None and (found[key] is None or quota[key] < found[key]):
                found[key], found["quota"] = quota[key], True
    return found


def check_room(est: Estimate, keep_weights: str, space: dict) -> tuple[str | None, str | None]:
    """(a refusal, a warning): the plan against the room under results:."""
    need, inodes = est.bytes(keep_weights), est.inodes
    free, free_inodes = space["bytes"], space["inodes"]
    where = f"{space['path']} ({'your lfs quota there' if space['quota'] else 'statvfs'}: " \
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
