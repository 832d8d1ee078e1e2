"""The resume decision in-process: which checkpoint a segment starts from, as a named
choice, for every case (no training; manifests written by the checkpoint module)."""

from dataclasses import replace
from pathlib import Path

import pytest

from conftest import spec
from cifarflow.engine.checkpoints import files as ckpt
from cifarflow.config import TrainConfig
from cifarflow.engine.checkpoints.resume import Choice, MidEpochResize, agree, compatible, decide

CFG = TrainConfig.read(spec(epochs=4))


def checkpoint(path: Path, epoch: int, step: int = 0, cfg: TrainConfig = CFG) -> Path:
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(b"weights")
    ckpt.write_manifest(path, "file", {"config_hash": cfg.shaping_hash(),
                                       "config": cfg.to_dict(), "epoch": epoch, "step": step})
    return path


def test_no_checkpoint_is_a_fresh_start(tmp_path):
    d = decide(CFG, 2, tmp_path / "segment-1", None, tmp_path / "work")
    assert (d.choice, d.path, d.notes) == (Choice.FRESH, None, ())


def test_the_furthest_checkpoint_wins_the_previous_segment_on_a_tie(tmp_path):
    prev = checkpoint(tmp_path / "segment-1", epoch=1)
    work = checkpoint(tmp_path / "work", epoch=1, step=7)
    assert decide(CFG, 2, tmp_path / "segment-2", prev, work).choice is Choice.WORK
    tie = tmp_path / "tie"
    checkpoint(tie, epoch=1)
    d = decide(CFG, 2, tmp_path / "segment-2", prev, tie)
    assert (d.choice, d.path) == (Choice.PREVIOUS_SEGMENT, prev)


def test_a_damaged_work_dir_is_a_logged_fallback(tmp_path):
    prev = checkpoint(tmp_path / "segment-1", epoch=1)
    work = checkpoint(tmp_path / "work", epoch=1, step=7)
    (work / "state.pt").write_bytes(b"other")  # fails its sha256
    d = decide(CFG, 2, tmp_path / "segment-2", prev, work)
    assert d.choice is Choice.PREVIOUS_SEGMENT
    assert len(d.notes) == 1 and "in-segment checkpoint unusable" in d.notes[0]
    assert d.notes[0].endswith(f"fell back to {prev}")


def test_a_missing_previous_segment_or_a_changed_config_is_refused(tmp_path):
    d = decide(CFG, 2, tmp_path / "segment-2", tmp_path / "segment-1", None)
    assert d.choice is Choice.REFUSED and "is missing; rerun snakemake" in str(d.error)
    other = replace(CFG, lr=CFG.lr * 2)
    work = checkpoint(tmp_path / "work", epoch=1, step=3, cfg=other)
    d = decide(CFG, 2, tmp_path / "segment-1", None, work)
    assert d.choice is Choice.REFUSED and "the training config changed (lr:" in str(d.error)
    prev = checkpoint(tmp_path / "run" / "segment-1", epoch=1, cfg=other)  # a segment too
    d = decide(CFG, 2, tmp_path / "run" / "segment-2", prev, None)
    assert d.choice is Choice.REFUSED and str(d.error).startswith(
        f"refusing to resume from {prev}: the training config changed (lr: {other.lr} -> "
        f"{CFG.lr}). Restore the config, or delete {tmp_path / 'run'} to train this run")


def test_elastic_changes_world_size_only_at_an_epoch_boundary(tmp_path):
    elastic = replace(CFG, elastic=True, world_size=2)
    at_boundary = checkpoint(tmp_path / "segment-1", epoch=1)
    assert compatible(elastic, ckpt.read_manifest(at_boundary), at_boundary, tmp_path) == 1
    d = decide(elastic, 2, tmp_path / "segment-2", at_boundary, None)
    assert (d.choice, d.resized_from) == (Choice.PREVIOUS_SEGMENT, 1)
    inside = checkpoint(tmp_path / "work", epoch=1, step=5)
    with pytest.raises(MidEpochResize):
        compatible(elastic, ckpt.read_manifest(inside), inside, tmp_path)
    d = decide(elastic, 2, tmp_path / "segment-2", at_boundary, inside)
    assert d.choice is Choice.PREVIOUS_SEGMENT and "set aside" in d.notes[0]


def test_a_checkpoint_past_the_target_is_published_as_is(tmp_path):
    prev = checkpoint(tmp_path / "segment-1", epoch=3)
    d = decide(CFG, 2, tmp_path / "segment-2", prev, None)
    assert d.choice is Choice.PREVIOUS_SEGMENT and "past this segment's target" in d.notes[0]


class OneRank:
    world_size = 1


def test_agree_on_one_rank_takes_the_decision_or_raises_its_error(tmp_path):
    prev = checkpoint(tmp_path / "segment-1", epoch=1)
    mine = decide(CFG, 2, tmp_path / "segment-2", prev, None)
    assert agree(OneRank(), mine, prev, None).path == prev
    refused = decide(CFG, 2, tmp_path / "segment-2", tmp_path / "nowhere", None)
    with pytest.raises(ckpt.CheckpointError, match="is missing"):
        agree(OneRank(), refused, tmp_path / "nowhere", None)
