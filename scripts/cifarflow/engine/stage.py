"""The dataset on node-local disk (data.stage): what Alliance asks of jobs, which must not
read their data from the shared filesystem while they train.

The first process of a job on each node copies the extracted split (``results/data/
cifar-10-batches-py``: a few files, checked at extraction) into ``$SLURM_TMPDIR`` and
verifies every copied file's md5 against the split's manifest; the others on that node
wait for it (a lock on node-local disk) and check the copy is of this split before they
read it. No torch."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

from ..data import MANIFEST, DatasetError
from ..files import file_digest
from ..jobfacts import job_id

STAGED = ".staged.json"  # written last, by the process that copied and verified the split


def node_local_dir(environ=os.environ) -> Path | None:
    """$SLURM_TMPDIR of this task (srun sets it again in every step), else the job's (the
    Snakemake jobstep strips it; job_env keeps it as CIFARFLOW_SLURM_TMPDIR)."""
    value = environ.get("SLURM_TMPDIR") or environ.get("CIFARFLOW_SLURM_TMPDIR")
    return Path(value) if value else None


def stage_split(batches: Path, mode: str, environ=os.environ, say=print) -> Path:
    """Where this process reads the split: node-local (``slurm_tmpdir``; ``auto`` where
    the job has a $SLURM_TMPDIR), or ``batches`` itself (``none``, or ``auto`` outside a
    Slurm job)."""
    if mode == "none":
        return Path(batches)
    local = node_local_dir(environ)
    if local is None:
        if mode == "slurm_tmpdir" and job_id(environ):
            raise DatasetError("data.stage slurm_tmpdir: this Slurm job has no SLURM_TMPDIR "
                               "(the cluster gives none): set data.stage to none")
        if mode == "slurm_tmpdir":
            say(f"[data] data.stage slurm_tmpdir outside a Slurm job: reading {batches} in place")
        return Path(batches)
    return stage_into(Path(batches), local / "cifarflow-data", say)


def split_identity(batches: Path) -> tuple[dict, str]:
    """The split's manifest (written at extraction) and its hash: what a copy is of."""
    try:
        text = (batches / MANIFEST).read_text()
        return json.loads(text), hashlib.sha256(text.encode()).hexdigest()
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{batches / MANIFEST} unreadable ({exc}): rerun extract_dataset") from exc


def stage_into(batches: Path, root: Path, say=print) -> Path:
    manifest, identity = split_identity(batches)
    target = root / batches.name
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other processes wait for the copy
        if staged_copy_holds(target, manifest, identity):
            say(f"[data] {socket.gethostname()}: reading the copy staged on this node, "
                f"{target} (checked: this split, every file's size)")
            return target
        t0 = time.perf_counter()
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        sizes = {}
        for name, entry in manifest["files"].items():
            shutil.copyfile(batches / name, target / name)
            if file_digest(target / name, "md5") != entry["md5"]:
                raise DatasetError(f"{target / name}: md5 differs from {batches / MANIFEST} "
                                   "after the copy to node-local disk (the source changed or "
                                   "the copy is damaged); rerun extract_dataset")
            sizes[name] = (target / name).stat().st_size
        shutil.copyfile(batches / MANIFEST, target / MANIFEST)
        (target / STAGED).write_text(json.dumps({"split": identity, "sizes": sizes}))
        size = sum(sizes.values())
        say(f"[data] {socket.gethostname()}: staged {len(sizes)} files ({size / 2**20:.1f} MB) "
            f"of {batches} to {target} in {time.perf_counter() - t0:.2f} s, md5 verified")
    return target


def staged_copy_holds(target: Path, manifest: dict, identity: str) -> bool:
    """A copy staged by an earlier process of this job: of this split, complete."""
    try:
        staged = json.loads((target / STAGED).read_text())
    except (OSError, ValueError):
        return False
    if staged.get("split") != identity or set(staged.get("sizes", {})) != set(manifest["files"]):
        return False
    return all((target / name).is_file() and (target / name).stat().st_size == size
               for name, size in staged["sizes"].items())
