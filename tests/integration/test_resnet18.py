"""resnet18 (BatchNorm, torchvision's model with a CIFAR stem) trains on CPU through the
real cli, and its segments resume bit-exactly: running statistics and the batch counter
are part of the checkpoint."""

import pytest

from conftest import assert_bit_identical, metrics_of, state_of, train

from cifarflow import data


@pytest.fixture(scope="module")
def tiny_cifar(tmp_path_factory):
    """200 training, 100 test images in the genuine on-disk format: resnet18 on 2 cores."""
    root = tmp_path_factory.mktemp("tiny")
    archive = data.prepare_archive("synthetic", root, synthetic={"train_size": 200,
                                                                 "test_size": 100})
    return data.extract_archive(archive, root)


@pytest.mark.slow  # 3 short resnet18 trainings on CPU: about a minute
def test_resnet18_trains_and_resumes_bit_exactly(tmp_path, tiny_cifar):
    kw = {"model": "resnet18", "batch_size": 50, "eval_batch_size": 100, "epochs": 2}
    train(tiny_cifar, tmp_path / "whole", spec_kw=kw)
    train(tiny_cifar, tmp_path / "one", spec_kw=kw, until_epoch=1)
    train(tiny_cifar, tmp_path / "two", spec_kw=kw, resume=tmp_path / "one")
    whole, split = state_of(tmp_path / "whole"), state_of(tmp_path / "two")
    assert_bit_identical(split["model"], whole["model"])
    assert int(whole["model"]["bn1.num_batches_tracked"]) == 8  # 2 epochs x 4 batches
    assert not bool((whole["model"]["bn1.running_var"] == 1).all())  # statistics were kept
    history = metrics_of(tmp_path / "whole")
    assert [r["epoch"] for r in history] == [1, 2]
    assert all(0 < r["train_loss"] < 10 for r in history)  # finite, no blow-up
    assert [r["train_loss"] for r in metrics_of(tmp_path / "two")] == \
        [r["train_loss"] for r in history]
