"""Checkpoints that are complete or absent, never half-written.

A checkpoint is a directory: payload file(s) first, each written to a temporary name,
fsync'ed and renamed; then ``checkpoint.json`` (sizes, sha256, progress, config hash),
written the same way, last. A directory without that manifest, or whose payload differs
from it, is refused with one clear error naming the file.

Backends: ``FileCheckpointer`` (one ``torch.save`` file, written by rank 0) for
cpu/gpu/ddp/mps/lightning and ``ShardedCheckpointer`` (``torch.distributed.checkpoint``,
every rank writes its shards) for fsdp.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

MANIFEST = "checkpoint.json"
FORMAT = 1


class CheckpointError(RuntimeError):
    pass


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def describe_files(root: Path) -> dict:
    return {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST
            and not p.name.startswith(".")}


def write_manifest(directory: Path, backend: str, meta: dict) -> dict:
    manifest = {"format": FORMAT, "backend": backend, "written_at": time.time(),
                "files": describe_files(directory), **meta}
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def read_manifest(directory: Path, verify: bool = True) -> dict:
    """The manifest of a complete checkpoint; raises CheckpointError otherwise."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"incomplete checkpoint {directory}: no {MANIFEST} (its writer "
                              "died before finishing); delete the directory to retrain that part")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"corrupt checkpoint manifest {path}: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {manifest.get('format')} is not {FORMAT}")
    if verify:
        for rel, want in manifest["files"].items():
            f = Path(directory) / rel
            if not f.is_file():
                raise CheckpointError(f"corrupt checkpoint: {f} is missing")
            if f.stat().st_size != want["size"]:
                raise CheckpointError(f"truncated checkpoint: {f} has {f.stat().st_size} bytes, "
                                      f"expected {want['size']}")
            if sha256_file(f) != want["sha256"]:
                raise CheckpointError(f"corrupt checkpoint: {f} fails its sha256 check")
    return manifest


def prepare_staging(directory: Path) -> Path:
    """A fresh staging directory beside the target; the target is replaced at the end."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.with_name(f".{directory.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def publish(staging: Path, directory: Path) -> None:
    """Swap the staging directory in. The old one (if any) is removed only afterwards."""
    old = directory.with_name(f".{directory.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        os.replace(directory, old)
    os.replace(staging, directory)
    fsync_dir(directory.parent)
    shutil.rmtree(old, ignore_errors=True)


def _save_torch(obj, path: Path) -> None:
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class FileCheckpointer:
    backend = "file"
    payload = "state.pt"

    def save(self, directory: Path, state: dict, meta: dict, dist) -> None:
        """state: the full training state (model, optimizer, ...) on rank 0."""
        if dist.is_main:
            staging = prepare_staging(directory)
            _save_torch(state, staging / self.payload)
            write_manifest(staging, self.backend, meta)
            publish(staging, Path(directory))
        dist.barrier()  # nobody reads before rank 0 has finished writing

    def load(self, directory: Path, dist, verify: bool = True) -> tuple[dict, dict]:
        import torch

        manifest = read_manifest(directory, verify=verify and dist.is_main)
        dist.barrier()
        state = torch.load(Path(directory) / self.payload, map_location=dist.device,
                           weights_only=False)
        return state, manifest


class ShardedCheckpointer:
    """torch.distributed.checkpoint: model and optimizer as shards of every rank;
    the small trainer state (progress, RNG, history) in ``trainer.pt`` from rank 0."""

    backend = "dcp"

    def save(self, directory: Path, state: dict, meta: dict, dist) -> None:
        import torch.distributed as tdist
        import torch.distributed.checkpoint as dcp

        staging = directory.with_name(f".{Path(directory).name}.staging")
        if dist.is_main:
            staging = prepare_staging(directory)
        tdist.barrier()
        sharded = {"model": state.pop("model"), "optimizer": state.pop("optimizer")}
        dcp.save(sharded, checkpoint_id=str(staging / "shards"))
        if dist.is_main:
            _save_torch(state, staging / "trainer.pt")
            write_manifest(staging, self.backend, meta)
            publish(staging, Path(directory))
        tdist.barrier()

    def load(self, directory: Path, dist, template: dict,
             verify: bool = True) -> tuple[dict, dict]:
        """template: {"model": ..., "optimizer": ...} state dicts to load into in place."""
        import torch
        import torch.distributed.checkpoint as dcp

        manifest = read_manifest(directory, verify=verify and dist.is_main)
        dist.barrier()
        dcp.load(template, checkpoint_id=str(Path(directory) / "shards"))
        state = torch.load(Path(directory) / "trainer.pt", map_location="cpu", weights_only=False)
        state.update(template)
        return state, manifest
