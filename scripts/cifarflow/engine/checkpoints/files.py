"""Checkpoints that are complete or absent, never half-written.

A checkpoint is a directory: payload file(s) first, each written to a temporary name,
fsync'ed and renamed; then ``checkpoint.json`` (sizes, sha256, progress, config hash),
written the same way, last. A directory without that manifest, or whose payload differs
from it, is refused with one clear error naming the file.

One interface, two backends, chosen by the strategy: ``FileCheckpointer`` (one
``torch.save`` file, written by rank 0) and ``ShardedCheckpointer``
(``torch.distributed.checkpoint``: every rank writes its own shards of model and
optimizer). Both take and give the same state: ``{"model", "optimizer", "trainer"}``, and
both cover small text files (the metric history) with the same manifest.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ...files import file_digest, read_jsonl

MANIFEST = "checkpoint.json"
METRICS = "metrics.jsonl"  # one JSON line per epoch, in every published checkpoint
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


def describe_files(root: Path) -> dict:
    """Every file but the manifest (DCP's own ``shards/.metadata`` included)."""
    return {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": file_digest(p, "sha256")}
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}


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
    if verify and manifest.get("weights_dropped"):
        raise CheckpointError(f"{directory} holds no weights: {manifest['weights_dropped']}. "
                              "Train its segment again (snakemake --forcerun on it), or keep "
                              "every segment's weights (segments.keep_weights: all)")
    if verify:
        for rel, want in manifest["files"].items():
            f = Path(directory) / rel
            if not f.is_file():
                raise CheckpointError(f"corrupt checkpoint: {f} is missing")
            if f.stat().st_size != want["size"]:
                raise CheckpointError(f"truncated checkpoint: {f} has {f.stat().st_size} bytes, "
                                      f"expected {want['size']}")
            if file_digest(f, "sha256") != want["sha256"]:
                raise CheckpointError(f"corrupt checkpoint: {f} fails its sha256 check")
    return manifest


def read_metrics(directory: Path) -> list[dict]:
    """The epoch records of a checkpoint directory (or of a metrics.jsonl path)."""
    path = Path(directory)
    path = path if path.name == METRICS else path / METRICS
    return read_jsonl(path)


def staging_path(directory: Path) -> Path:
    directory = Path(directory)
    return directory.with_name(f".{directory.name}.staging")


def prepare_staging(directory: Path) -> Path:
    """A fresh staging directory beside the target; the target is replaced at the end."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_path(directory)
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


def recover(directory: Path) -> None:
    """A writer killed between publish's two renames left the old checkpoint only beside
    the target (``.<name>.old``), whole: put it back where readers look."""
    directory = Path(directory)
    old = directory.with_name(f".{directory.name}.old")
    if not directory.exists() and old.is_dir():
        os.replace(old, directory)


def _save_torch(obj, path: Path) -> None:
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _finish(staging: Path, directory: Path, backend: str, meta: dict, files: dict) -> None:
    """Rank 0: the small files, then the manifest over everything, then the swap."""
    for name, text in files.items():
        atomic_write_text(staging / name, text)
    write_manifest(staging, backend, meta)
    publish(staging, Path(directory))


class Checkpointer:
    """save(directory, state, meta, files) / load(directory, template) -> state.

    state: {"model": ..., "optimizer": ..., "trainer": {...}} as the strategy gives them;
    template: the same keys for model and optimizer, the live state dicts a sharded load
    fills in place; files: name -> text, written beside the payload and covered by the
    manifest. The caller's dicts are never modified."""

    backend = ""

    def __init__(self, dist):
        self.dist = dist  # the strategy: rank, device, barrier


class FileCheckpointer(Checkpointer):
    backend = "file"
    payload = "state.pt"

    def save(self, directory: Path, state: dict, meta: dict, files: dict) -> None:
        if self.dist.is_main:
            staging = prepare_staging(directory)
            _save_torch(state, staging / self.payload)
            _finish(staging, directory, self.backend, meta, files)
        self.dist.barrier()  # nobody reads before rank 0 has finished writing

    def load(self, directory: Path, template: dict) -> dict:
        """The state on the CPU: ``load_state_dict`` copies the model's tensors onto its
        parameters' device, and the optimizer's where torch keeps them (an Adam ``step``
        stays on the CPU unless the optimizer is fused or capturable; mapped onto the GPU,
        foreach Adam would read it back, a host sync per parameter per step)."""
        import torch

        return torch.load(Path(directory) / self.payload, map_location="cpu",
                          weights_only=False)


class ShardedCheckpointer(Checkpointer):
    """Model and optimizer as shards of every rank; the trainer state in ``trainer.pt``."""

    backend = "dcp"

    def save(self, directory: Path, state: dict, meta: dict, files: dict) -> None:
        import torch.distributed.checkpoint as dcp

        staging = prepare_staging(directory) if self.dist.is_main else staging_path(directory)
        self.dist.barrier()
        dcp.save({"model": state["model"], "optimizer": state["optimizer"]},
                 checkpoint_id=str(staging / "shards"))
        if self.dist.is_main:
            _save_torch(state["trainer"], staging / "trainer.pt")
            _finish(staging, directory, self.backend, meta, files)
        self.dist.barrier()

    def load(self, directory: Path, template: dict) -> dict:
        import torch
        import torch.distributed.checkpoint as dcp

        sharded = {"model": template["model"], "optimizer": template["optimizer"]}
        dcp.load(sharded, checkpoint_id=str(Path(directory) / "shards"))
        trainer = torch.load(Path(directory) / "trainer.pt", map_location="cpu", weights_only=False)
        return {**sharded, "trainer": trainer}
