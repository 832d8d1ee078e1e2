"""Elastic resume (segments.elastic): a run goes on with another world size at an epoch
boundary, with a log line and a summary column; without the flag the change is refused."""

import pytest

from conftest import PY, cli, metrics_of, snakemake, spec, summary_rows
from cifarflow.engine.checkpoints import files as ckpt
from cifarflow.results.table import summarize_run

COMMON = dict(epochs=3, lr=0.05, momentum=0.9)


def segment(cifar_dir, out, strategy, world, until, resume=None, check=True, **kw):
    args = ["train", "--spec", spec(strategy, world_size=world, **COMMON, **kw), "--data",
            cifar_dir, "--out", out, "--until-epoch", until, "--threads", 1]
    if resume:
        args += ["--resume", resume]
    return cli("launch", "--nproc", world, "--", PY, "-m", "cifarflow", *args, check=check)


@pytest.mark.parametrize("strategy, before, after", [
    ("ddp", 1, 2), pytest.param("fsdp", 2, 1, marks=[pytest.mark.slow, pytest.mark.variant])])
def test_a_run_goes_on_with_another_world_size_and_keeps_learning(cifar_dir, tmp_path,
                                                                   strategy, before, after):
    first, second = tmp_path / "segment-1", tmp_path / "segment-2"
    segment(cifar_dir, first, strategy, before, until=1)
    out = segment(cifar_dir, second, strategy, after, until=3, resume=first, elastic=True)
    assert (f"elastic resume: world size {before} -> {after} at epoch 2; from here on the run "
            "is no longer bit-exact") in out.stdout
    history = metrics_of(second)
    assert [h["world_size"] for h in history] == [before, after, after]
    assert history[-1]["train_loss"] < history[0]["train_loss"]  # it keeps learning
    assert history[-1]["test_acc"] > 0.3
    manifest = ckpt.read_manifest(second)
    assert manifest["done"] and manifest["resizes"] == [{"epoch": 1, "from": before, "to": after}]
    row = summarize_run(strategy, {"strategy": strategy, "spec": manifest["config"],
                                   "resources": {"cpus_per_task": 1},
                                   "metrics": str(second / "metrics.jsonl")})
    assert row["resized"] == f"{before}->{after}@epoch2" and row["status"] == "ok"


@pytest.mark.slow
@pytest.mark.variant
def test_another_world_size_without_the_flag_is_refused_with_the_way_out(cifar_dir, tmp_path):
    first = tmp_path / "segment-1"
    segment(cifar_dir, first, "ddp", 1, until=1)
    out = segment(cifar_dir, tmp_path / "segment-2", "ddp", 2, until=3, resume=first,
                  check=False)
    assert out.returncode != 0
    said = out.stderr
    assert "the training config changed (world_size: 1 -> 2)" in said
    assert "set segments.elastic: true" in said


def test_a_checkpoint_inside_an_epoch_cannot_change_world_size(cifar_dir, tmp_path):
    """A segment that stopped mid-epoch (its time budget) left a checkpoint the new world
    size cannot split exactly: one clear error, not a silent restart."""
    first = tmp_path / "segment-1"
    segment(cifar_dir, first, "ddp", 1, until=3, budget_s=0.01, margin_s=0)
    m = ckpt.read_manifest(first)
    assert m["step"] > 0 and not m["done"], m  # stopped inside epoch 1
    out = segment(cifar_dir, tmp_path / "segment-2", "ddp", 2, until=3, resume=first,
                  elastic=True, budget_s=0.01, margin_s=0, check=False)
    assert out.returncode != 0 and "at an epoch boundary only" in out.stderr


@pytest.mark.slow  # two workflow runs: about 30 s
def test_a_new_world_size_goes_on_through_the_workflow(tmp_path):
    """A ddp run's first segment trains on 1 rank; distributed.world_size becomes 2 and
    Snakemake is run again: segment 1 stands (not retrained), segment 2 resumes from it
    on 2 ranks, and summary.csv says so in `resized`."""
    config = tmp_path / "elastic.yaml"
    text = ("strategies: [ddp]\ndata: {source: synthetic, synthetic: {train_size: 1000, "
            "test_size: 200}}\ntrain: {epochs: 2, batch_size: 100, lr: 0.05, log_interval_s: 100}"
            "\ndistributed: {world_size: 1, device: cpu}\nsegments: {count: 2, elastic: true}\n"
            "resources: {cpus_per_task: 1}\n")
    config.write_text(text)
    snakemake(tmp_path, "--cores", 2, "results/runs/ddp/segment-1", configfile=config)
    first = ckpt.read_manifest(tmp_path / "results/runs/ddp/segment-1")
    config.write_text(text.replace("world_size: 1", "world_size: 2"))
    out = snakemake(tmp_path, "--cores", 2, configfile=config)
    assert ("run ddp: world size 1 -> 2 (segments.elastic): its finished segments stand"
            in out.stdout + out.stderr)
    assert ckpt.read_manifest(tmp_path / "results/runs/ddp/segment-1") == first  # kept
    log = (tmp_path / "results/logs/train/ddp/segment-2.log").read_text()
    assert "elastic resume: world size 1 -> 2 at epoch 2" in log
    assert [h["world_size"] for h in metrics_of(tmp_path / "results/runs/ddp/segment-2")] == [1, 2]
    row = summary_rows(tmp_path)["ddp"]
    assert (row["resized"], row["world_size"], row["status"]) == ("1->2@epoch2", "2", "ok")
