"""Training with train.augment, train.label_smoothing and eval.tta through the real cli and
snakemake: 2 segments end bit-identical to 1 (resumed inside an epoch too: the draws of the
batch it resumes at are those of the uninterrupted run), for a plain run, 2 gloo ranks of
ddp, and fastnet's recipe run by `snakemake --cores 2`."""

import json
import re

import pytest

from conftest import (ROOT, assert_bit_identical, cli, metrics_of, same_metrics, snakemake,
                      run_batches, state_of, summary_rows, train)

CONFIGS = ROOT / "tests" / "configs"

AUGMENTED = dict(epochs=2, augment={"flip": True, "crop": 4}, label_smoothing=0.1, tta="flip",
                 weight_decay=5e-4)


def test_plain_run_with_augmentation_resumes_bit_exactly_inside_an_epoch(cifar_dir, tmp_path):
    train(cifar_dir, tmp_path / "whole", spec_kw=AUGMENTED)
    train(cifar_dir, tmp_path / "s1", spec_kw=AUGMENTED, until_epoch=1)
    # segment 2's first try saves after every batch and ends the run; a retry resumes from
    # its last in-segment save, inside epoch 2
    train(cifar_dir, tmp_path / "try1", spec_kw={**AUGMENTED, "checkpoint_interval_s": 1e-6},
          resume=tmp_path / "s1", until_epoch=2, work=tmp_path / "work")
    out = train(cifar_dir, tmp_path / "s2", spec_kw=AUGMENTED, resume=tmp_path / "s1",
                work=tmp_path / "work")
    batch = int(re.search(r"resumed from \S+work at epoch 2, batch (\d+)", out.stdout)[1])
    assert batch > 0  # inside the epoch
    whole, split = state_of(tmp_path / "whole"), state_of(tmp_path / "s2")
    assert_bit_identical(whole["model"], split["model"])
    history = metrics_of(tmp_path / "whole")
    assert same_metrics(history, metrics_of(tmp_path / "s2"))
    assert all(0 <= r["test_acc_tta"] <= 1 for r in history)  # recorded beside test_acc


def test_ddp_ranks_with_augmentation_resume_bit_exactly(cifar_dir, tmp_path):
    kw = dict(threads=1, nproc=2, spec_kw={**AUGMENTED, "batch_size": 100,
                                           "strategy": "ddp", "world_size": 2, "device": "cpu"})
    train(cifar_dir, tmp_path / "whole", **kw)
    train(cifar_dir, tmp_path / "s1", until_epoch=1, **kw)
    train(cifar_dir, tmp_path / "s2", resume=tmp_path / "s1", **kw)
    assert_bit_identical(state_of(tmp_path / "whole")["model"], state_of(tmp_path / "s2")["model"])
    history = metrics_of(tmp_path / "whole")
    assert same_metrics(history, metrics_of(tmp_path / "s2"))
    assert "test_acc_tta" in history[-1] and history[-1]["world_size"] == 2


@pytest.mark.slow  # fastnet (2 M parameters) through snakemake and once more in one go: ~1 min
def test_fastnet_recipe_trains_and_resumes_bit_exactly_through_snakemake(tmp_path):
    config = [ROOT / "config/presets/fastnet.yaml", CONFIGS / "fastnet/config.yaml"]
    snakemake(tmp_path, "--cores", 2, configfile=config)
    row = summary_rows(tmp_path)["cpu"]
    assert (row["model"], row["status"], row["segments"]) == ("fastnet", "ok", "2")
    assert (row["augment"], float(row["label_smoothing"])) == ("flip+crop2", 0.2)
    assert 0 <= float(row["test_acc_tta"]) <= 1
    run = tmp_path / "results/runs/cpu"
    spec = json.loads((run / "spec.json").read_text())
    assert (spec["model"], spec["augment"], spec["tta"]) == ("fastnet", {"flip": True, "crop": 2},
                                                             "flip")
    log = (tmp_path / "results/logs/train/cpu/segment-2.log").read_text()
    assert "resumed from results/runs/cpu/segment-1 at epoch 2" in log
    cli("train", "--spec", run / "spec.json", "--data", run_batches(tmp_path, "cpu"),
        "--out", tmp_path / "whole", "--threads", 2)
    assert_bit_identical(state_of(tmp_path / "whole")["model"], state_of(run / "segment-2")["model"])
    history = metrics_of(tmp_path / "whole")
    assert same_metrics(history, metrics_of(run / "segment-2"))
    assert all(0 < r["train_loss"] < 10 for r in history)  # finite, no blow-up
