"""Where a segment starts: the resume decision, a pure function of the checkpoints it
may start from, and the one collective that makes every rank take it.

The candidates are the previous segment (``--resume``) and this run's in-segment
checkpoint (``--work``, left by a killed or preempted try). The furthest one wins, the
previous segment on a tie; a damaged or other-world in-segment checkpoint is set aside
with a note (a logged fallback); a damaged previous segment or a changed training
config is an error. Nothing is ever silently restarted from scratch."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from . import files as ckpt


class MidEpochResize(ckpt.CheckpointError):
    """An elastic run met a checkpoint of another world size taken inside an epoch."""


class Choice(enum.IntEnum):
    REFUSED = -1           # an error: every rank raises
    FRESH = 0              # the start of the run
    PREVIOUS_SEGMENT = 1   # the previous segment's published checkpoint
    WORK = 2               # this run's in-segment checkpoint


@dataclass(frozen=True)
class Decision:
    choice: Choice
    path: Path | None = None
    resized_from: int = 0          # world size of the checkpoint where an elastic run changes it
    notes: tuple = ()              # fallbacks to log and keep in the summary
    error: ckpt.CheckpointError | None = None


def compatible(cfg, manifest: dict, directory: Path, what) -> int | None:
    """None if the checkpoint's config is this one; the checkpoint's world size if only
    that changed and the run is elastic; else a CheckpointError."""
    if manifest.get("config_hash") == cfg.shaping_hash():
        return None
    diff = cfg.shaping_diff(manifest.get("config", {}))
    if set(diff) == {"world_size"} and cfg.elastic:
        if manifest["step"]:
            raise MidEpochResize(
                f"{directory} stopped inside epoch {manifest['epoch'] + 1}: a run changes "
                f"world size ({diff['world_size'][0]} -> {cfg.world_size}) at an "
                "epoch boundary only; finish that epoch on the old world size first")
        return diff["world_size"][0]
    changes = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in diff.items())
    hint = ("; or set segments.elastic: true to go on with the new world size (the run is "
            "then no longer bit-exact)" if set(diff) == {"world_size"} else "")
    raise ckpt.CheckpointError(
        f"refusing to resume from {directory}: the training config changed ({changes}). "
        f"Restore the config, or delete {what} to train this run afresh{hint}")


def decide(cfg, until_epoch: int, out_dir: Path, resume_dir: Path | None,
           work_dir: Path | None,
           read: Callable[[Path], dict] = ckpt.read_manifest) -> Decision:
    """The checkpoint this segment starts from (rank 0 decides; nothing is loaded). A
    checkpoint whose writer died between publish's renames is put back first."""
    found, notes = [], []
    for directory in (resume_dir, work_dir):
        if directory is not None:
            ckpt.recover(directory)
    run_dir = out_dir.parent
    try:
        if resume_dir is not None:
            if not resume_dir.exists():
                raise ckpt.CheckpointError(f"previous segment checkpoint {resume_dir} is "
                                           "missing; rerun snakemake to retrain it")
            m = read(resume_dir)
            resized = compatible(cfg, m, resume_dir, run_dir)
            found.append(((m["epoch"], m["step"]), Choice.PREVIOUS_SEGMENT, resume_dir, resized))
    except ckpt.CheckpointError as exc:
        return Decision(Choice.REFUSED, error=exc)
    fallback = resume_dir or "the start of the run"
    if work_dir is not None and work_dir.exists():
        try:
            m = read(work_dir)
        except ckpt.CheckpointError as exc:
            notes.append(f"in-segment checkpoint unusable ({exc}); fell back to {fallback}")
        else:
            try:
                resized = compatible(cfg, m, work_dir, work_dir)
            except MidEpochResize as exc:
                notes.append(f"in-segment checkpoint set aside ({exc}); fell back to {fallback}")
            except ckpt.CheckpointError as exc:
                return Decision(Choice.REFUSED, error=exc)
            else:
                found.append(((m["epoch"], m["step"]), Choice.WORK, work_dir, resized))
    if not found:
        return Decision(Choice.FRESH, notes=tuple(notes))
    # the furthest; on a tie the previous segment (PREVIOUS_SEGMENT < WORK: key below)
    pos, choice, path, resized = max(found, key=lambda f: (f[0], -f[1]))
    if pos > (until_epoch, 0):
        notes.append(f"{path} is at epoch {pos[0] + 1} batch {pos[1]}, past this "
                     f"segment's target epoch {until_epoch} (segments.count changed?): "
                     "nothing to train, published as is")
    return Decision(choice, path, resized or 0, tuple(notes))


def agree(strategy, decision: Decision | None, resume_dir, work_dir) -> Decision:
    """Rank 0's decision on every rank (the others pass None): one all-reduce of the
    choice and the resized-from world size. Raises on every rank when it was refused."""
    code, resized = (int(decision.choice), decision.resized_from) if decision else (0, 0)
    if strategy.world_size > 1:
        code, resized = (int(v) for v in strategy.all_reduce(
            torch.tensor([code, resized], device=strategy.reduce_device)))
    choice = Choice(code)
    if choice is Choice.REFUSED:
        raise (decision.error if decision else None) or ckpt.CheckpointError(
            "rank 0 refused the checkpoint (see its message)")
    path = {Choice.FRESH: None, Choice.PREVIOUS_SEGMENT: resume_dir, Choice.WORK: work_dir}[choice]
    return Decision(choice, path, resized, decision.notes if decision else ())
