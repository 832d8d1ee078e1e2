"""train.early_stop on real cpu runs of the synthetic data. The seed's LeNet at lr 3.0 kills
every logit (its final ReLU) in epoch 1: the loss is ln 10 from epoch 2 on, on any machine."""

import json

from cifarflow.engine.checkpoints import files as ckpt
from cifarflow.results.aggregate import aggregate
from cifarflow.layout import RunPaths
from conftest import assert_bit_identical, cli, metrics_of, same_metrics, spec, state_of, train

DEAD = {"epochs": 7, "lr": 3.0}
STOP = {"enabled": True, "patience": 2}


def test_a_run_that_stopped_learning_stops_done_and_two_segments_equal_one(cifar_dir, tmp_path):
    one = tmp_path / "one"
    out = train(cifar_dir, one, spec_kw={**DEAD, "early_stop": STOP}).stdout
    m = ckpt.read_manifest(one)
    reason = ("early stop: train_loss has not improved by more than 0.001 for 2 epoch(s) "
              "(best 2.3026 at epoch 2)")
    assert (m["done"], m["epoch"], m["step"], m["early_stop"]) == (True, 4, 0, reason)
    assert [r["epoch"] for r in metrics_of(one)] == [1, 2, 3, 4]
    assert f"{reason}: the run ends at epoch 4 of 7 (train.early_stop)" in out
    assert "WARNING: train_loss has not improved" in out and "ReLU on its logits" in out
    assert "stopping at" not in out  # a finished run, not an interrupted segment
    assert m["segment_runs"][-1]["stopped"] is None
    assert m["segment_runs"][-1]["ended"] == "completed"

    # segment 1 ends at epoch 3 one epoch short of patience: segment 2 stops at epoch 4,
    # from the epoch records segment 1 checkpointed
    first, second, third = (tmp_path / f"segment-{k}" for k in (1, 2, 3))
    train(cifar_dir, first, spec_kw={**DEAD, "early_stop": STOP}, until_epoch=3)
    assert not ckpt.read_manifest(first)["done"] and ckpt.read_manifest(first)["early_stop"] == ""
    train(cifar_dir, second, spec_kw={**DEAD, "early_stop": STOP}, resume=first)
    assert ckpt.read_manifest(second)["done"] and ckpt.read_manifest(second)["epoch"] == 4
    assert_bit_identical(state_of(one)["model"], state_of(second)["model"])
    assert same_metrics(metrics_of(one), metrics_of(second))
    # a later planned segment of a stopped run trains nothing and publishes it as is
    out = train(cifar_dir, third, spec_kw={**DEAD, "early_stop": STOP}, resume=second).stdout
    assert "nothing to train, its checkpoint is published as is" in out
    assert ckpt.read_manifest(third)["done"] and ckpt.read_manifest(third)["epoch"] == 4
    assert_bit_identical(state_of(one)["model"], state_of(third)["model"])

    # switched off (not a shaping key): the same checkpoint resumes and trains on
    off = tmp_path / "off"
    out = train(cifar_dir, off, spec_kw=DEAD, resume=second).stdout
    assert ckpt.read_manifest(off)["done"] and ckpt.read_manifest(off)["epoch"] == 7


def test_off_by_default_the_log_and_the_advice_name_the_plateau(cifar_dir, tmp_path):
    out_dir = tmp_path / "segment-1"
    out = train(cifar_dir, out_dir, spec_kw={**DEAD, "early_stop": {"patience": 2}}).stdout
    m = ckpt.read_manifest(out_dir)
    assert (m["done"], m["epoch"], m["early_stop"]) == (True, 7, "")
    assert out.count("WARNING: train_loss has not improved by more than 0.001 for 2 epoch(s) "
                     "(best 2.3026 at epoch 2): the run stopped learning. lenet (the seed's "
                     "Net) ends in a ReLU on its logits") == 1
    run = {"strategy": "cpu", "spec": json.loads(spec(**DEAD, early_stop={"patience": 2})
                                                 .read_text()),
           "resources": {"cpus_per_task": 2}, "metrics": str(out_dir / "metrics.jsonl"),
           "segments": 1, "planned_segments": 1, "logs": str(tmp_path / "logs")}
    aggregate({"cpu_dead": run}, tmp_path / "results", tmp_path / "plots")
    advice = (tmp_path / "results/advice.md").read_text()
    assert ("- cpu_dead: stopped learning: train_loss has not improved by more than 0.001 "
            "for 5 epoch(s) (best 2.3026 at epoch 2). lenet (the seed's Net) ends in a ReLU "
            "on its logits") in advice


def test_in_a_pack_early_stop_ends_that_member_only(cifar_dir, tmp_path):
    """One pack job, two members (cifarflow train-pack, as the workflow runs it): the dead
    LeNet stops at epoch 4, its neighbour (lr 0.01, still learning) trains all 5 epochs."""
    results = tmp_path / "results"
    members = {"cpu_dead": {"lr": 3.0}, "cpu_learning": {"lr": 0.01}}
    for name, kw in members.items():
        path = RunPaths(str(results), name).spec
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        text = json.loads(spec(epochs=5, early_stop=STOP, **kw).read_text())
        (tmp_path / path).write_text(json.dumps({**text, "run": name}))
    out = cli("train-pack", "--pack", "cpu-pack001", "--segment", 1, "--members", *members,
              "--results", results, "--data", cifar_dir, "--until-epoch", 5, "--threads", 1,
              "--budget-min", 0, "--mem-per-cpu", 1000, "--slots", 2, "--record",
              tmp_path / "record.json", cwd=tmp_path).stdout
    dead, learning = (ckpt.read_manifest(results / f"runs/{n}/segment-1") for n in members)
    assert (dead["done"], dead["epoch"]) == (True, 4) and dead["early_stop"].startswith(
        "early stop: train_loss has not improved")
    assert (learning["done"], learning["epoch"], learning["early_stop"]) == (True, 5, "")
    assert "cpu_dead: finished, epoch 4 (done)" in out
    assert "cpu_learning: finished, epoch 5 (done)" in out
