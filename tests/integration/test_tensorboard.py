"""TensorBoard event files through the real CLI: rank 0 alone writes them, and a run's
segments and retries draw one curve (steps never repeat or go back)."""

import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from conftest import metrics_of, train
from cifarflow.engine.checkpoints import files as ckpt
from cifarflow.engine.report import EPOCH_SCALARS

SPEC = dict(epochs=2, log_interval_s=0)  # every batch's loss is logged
STEPS = 2000 // 100                      # batches per epoch of the cifar_dir data, one rank


def event_files(board) -> list:
    return sorted(board.glob("events.out.tfevents.*"))


def raw_steps(path, tag: str) -> list[int]:
    """Steps of `tag` as written in one event file, in file order."""
    return [e.step for e in EventFileLoader(str(path)).Load()
            for v in e.summary.value if v.tag == tag]


def curves(board) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows: every file of the directory, purges applied."""
    acc = EventAccumulator(str(board), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_epoch_scalars(board, records: list[dict], steps_per_epoch: int) -> None:
    shown = curves(board)
    for tag, key in EPOCH_SCALARS.items():
        assert [step for step, _ in shown[tag]] == [r["epoch"] * steps_per_epoch for r in records]
        for (_, value), r in zip(shown[tag], records):
            assert value == pytest.approx(r[key], rel=1e-6, abs=1e-7), (tag, r["epoch"])


def test_two_segments_draw_one_curve(cifar_dir, tmp_path):
    board = tmp_path / "tensorboard" / "cpu"
    first, second = tmp_path / "segment-1", tmp_path / "segment-2"
    train(cifar_dir, first, spec_kw=SPEC, until_epoch=1, tensorboard=board)
    train(cifar_dir, second, spec_kw=SPEC, resume=first, tensorboard=board)

    one, two = event_files(board)  # one file per segment
    assert raw_steps(one, "train/loss") == list(range(1, STEPS + 1))
    assert raw_steps(two, "train/loss") == list(range(STEPS + 1, 2 * STEPS + 1))
    losses = curves(board)["train/loss"]
    assert [step for step, _ in losses] == list(range(1, 2 * STEPS + 1))
    assert all(math.isfinite(value) for _, value in losses)
    # epoch 1 as the first segment recorded it, epoch 2 as the second did
    assert_epoch_scalars(board, metrics_of(first) + metrics_of(second)[1:], STEPS)


def test_train_tensorboard_false_writes_no_curves(cifar_dir, tmp_path):
    """train.tensorboard: false (job venvs then install no tensorboard): the segment trains
    and writes no event file, though the workflow hands it the directory."""
    board = tmp_path / "tensorboard" / "cpu"
    out = train(cifar_dir, tmp_path / "segment-1", spec_kw={**SPEC, "epochs": 1,
                                                            "tensorboard": False},
                tensorboard=board)
    assert "(done)" in out.stdout and not board.exists()


def test_a_retry_from_the_in_segment_checkpoint_hides_what_it_retrains(cifar_dir, tmp_path):
    board, work = tmp_path / "tensorboard" / "cpu", tmp_path / "work"
    steps = 2000 // 400
    # an in-segment save at every batch boundary: the last one is one batch before the end
    kw = dict(spec_kw={**SPEC, "batch_size": 400, "checkpoint_interval_s": 1e-6}, work=work,
              tensorboard=board)
    train(cifar_dir, tmp_path / "killed", **kw)  # stands for a try killed after its last save
    m = ckpt.read_manifest(work)
    resumed_at = m["epoch"] * steps + m["step"]
    assert resumed_at == 2 * steps - 1
    retry = train(cifar_dir, tmp_path / "segment-1", **kw)
    assert f"resumed from {work}" in retry.stdout

    killed, again = event_files(board)
    assert raw_steps(killed, "train/loss")[-1] == 2 * steps  # written past the resume point
    start = [e.step for e in EventFileLoader(str(again)).Load() if e.HasField("session_log")]
    assert start == [resumed_at + 1]  # TensorBoard drops the earlier events from here on
    assert raw_steps(again, "train/loss") == [2 * steps]
    shown = curves(board)
    assert [step for step, _ in shown["train/loss"]] == list(range(1, 2 * steps + 1))
    assert_epoch_scalars(board, metrics_of(tmp_path / "segment-1"), steps)


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("lightning", marks=[pytest.mark.slow,
                                                                    pytest.mark.variant])])
def test_rank_0_alone_writes(cifar_dir, tmp_path, strategy):
    board = tmp_path / "tensorboard" / strategy
    first, second = tmp_path / "segment-1", tmp_path / "segment-2"
    kw = dict(threads=1, nproc=2, spec_kw={**SPEC, "strategy": strategy, "world_size": 2},
              tensorboard=board)
    train(cifar_dir, first, until_epoch=1, **kw)
    assert len(event_files(board)) == 1
    train(cifar_dir, second, resume=first, **kw)
    assert len(event_files(board)) == 2
    steps = STEPS // 2  # each rank trains half of every epoch
    assert [step for step, _ in curves(board)["train/loss"]] == list(range(1, 2 * steps + 1))
    assert_epoch_scalars(board, metrics_of(second), steps)
