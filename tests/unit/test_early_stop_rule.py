"""train.early_stop and the plateau watch, decided from epoch records alone (as Lightning's
EarlyStopping decides), and the summary and advice built from them."""

import json

import pandas as pd
import pytest

from cifarflow.results.advice import plateau_advice
from cifarflow.results.table import summarize_run
from cifarflow.config import with_defaults
from cifarflow.early_stop import EarlyStop, Watch

# the seed's LeNet on CIFAR-format data (lr 3.0): every logit dead from epoch 2 on
DEAD = [2.364129, 2.302585, 2.302585, 2.302585, 2.302585, 2.302585]


def records(losses, accs=None):
    accs = accs or [0.1] * len(losses)
    return [{"epoch": i + 1, "train_loss": loss, "test_acc": acc, "train_acc": acc}
            for i, (loss, acc) in enumerate(zip(losses, accs))]


def settings(**kw):
    return {**with_defaults({"train": {"early_stop": kw}})["train"]["early_stop"]}


def test_defaults_are_off_and_watch_the_train_loss():
    stop = EarlyStop.of(settings(), "lenet")
    assert not stop.enabled
    assert (stop.rule.metric, stop.rule.mode, stop.rule.patience, stop.rule.min_delta) == \
        ("train_loss", "min", 5, 0.001)
    assert stop.stop_reason(records(DEAD + DEAD)) == ""  # off: never stops


def test_improvement_must_beat_the_best_by_more_than_min_delta():
    watch = Watch("train_loss", "min", patience=2, min_delta=0.01)
    # 1.0 -> 0.995 (0.005, not enough) -> 0.985 (0.015 below the best: improves)
    assert watch.plateau(records([1.0, 0.995])).epochs == 1
    found = watch.plateau(records([1.0, 0.995, 0.985]))
    assert (found.best, found.best_epoch, found.epochs) == (0.985, 3, 0)
    assert watch.stalled(records([1.0, 0.995, 0.992])).best_epoch == 1
    # a worse value does not move the best either
    assert watch.plateau(records([1.0, 2.0, 1.5])).epochs == 2


def test_accuracy_is_maximised_under_mode_auto():
    stop = EarlyStop.of(settings(enabled=True, metric="test_acc", patience=2, min_delta=0.0),
                        "lenet")
    assert stop.rule.mode == "max"
    hist = records([2.0, 1.9, 1.8, 1.7], accs=[0.2, 0.5, 0.5, 0.4])
    assert stop.stop_reason(hist[:3]) == ""
    assert stop.stop_reason(hist) == ("early stop: test_acc has not improved by more than 0 "
                                      "for 2 epoch(s) (best 0.5000 at epoch 2)")
    # the loss watch stays on the train loss, at its own tolerance
    assert (stop.loss.metric, stop.loss.min_delta) == ("train_loss", 0.001)


def test_the_dead_lenet_stops_after_patience_epochs_and_is_named_once():
    stop = EarlyStop.of(settings(enabled=True, patience=2), "lenet")
    reasons = [stop.stop_reason(records(DEAD[:n])) for n in range(1, 7)]
    assert [bool(r) for r in reasons] == [False, False, False, True, True, True]
    assert reasons[3] == ("early stop: train_loss has not improved by more than 0.001 for "
                          "2 epoch(s) (best 2.3026 at epoch 2)")
    notes = [stop.newly_flat(records(DEAD[:n])) for n in range(1, 7)]
    assert [bool(n) for n in notes] == [False, False, False, True, False, False]
    assert "stopped learning" in notes[3] and "ReLU on its logits" in notes[3]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="patience must be >= 1"):
        Watch("train_loss", "min", 0, 0.0)
    with pytest.raises(ValueError, match="metric 'val_loss'"):
        Watch("val_loss", "min", 1, 0.0)


def write_run(tmp_path, name, history, manifest, **spec):
    seg = tmp_path / name / "segment-1"
    seg.mkdir(parents=True)
    (seg / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    (seg / "checkpoint.json").write_text(json.dumps(manifest))
    full = {"device": "cpu", "model": "lenet", "batch_size": 100, "world_size": 1,
            "epochs": 6, "early_stop": settings(patience=2), **spec}
    return {"strategy": "cpu", "spec": full, "resources": {"cpus_per_task": 1},
            "metrics": str(seg / "metrics.jsonl"), "segments": 1, "planned_segments": 1,
            "logs": str(tmp_path / "logs" / name)}


def timed(history):
    return [{**r, "images_per_sec": 100.0, "wall_s": 1.0, "peak_mem_mb": 10.0} for r in history]


def test_summary_marks_an_early_stopped_run_done_with_its_reason_and_the_advice_says_why(tmp_path):
    reason = ("early stop: train_loss has not improved by more than 0.001 for 2 epoch(s) "
              "(best 2.3026 at epoch 2)")
    stopped = summarize_run("dead", write_run(
        tmp_path, "dead", timed(records(DEAD[:4])), {"early_stop": reason},
        early_stop=settings(enabled=True, patience=2)))
    learning = summarize_run("fine", write_run(
        tmp_path, "fine", timed(records([2.0, 1.5, 1.2, 1.0, 0.9, 0.8])), {}))
    flat_off = summarize_run("flat", write_run(
        tmp_path, "flat", timed(records(DEAD)), {}))
    assert (stopped["status"], stopped["epochs"], stopped["early_stop"]) == \
        ("early_stopped", 4, reason)
    assert stopped["plateau"].startswith("train_loss has not improved by more than 0.001 for 2")
    assert (learning["status"], learning["early_stop"], learning["plateau"]) == ("ok", "", "")
    assert (flat_off["status"], flat_off["early_stop"]) == ("ok", "")
    assert flat_off["plateau"] == ("train_loss has not improved by more than 0.001 for 4 "
                                   "epoch(s) (best 2.3026 at epoch 2)")
    tips = plateau_advice(pd.DataFrame([stopped, learning, flat_off]))
    assert len(tips) == 2
    assert tips[0].startswith("dead: stopped learning: train_loss has not improved")
    assert "ended by train.early_stop at epoch 4 of 6" in tips[0]
    assert tips[1].startswith("flat: stopped learning") and "ReLU on its logits" in tips[1]


def test_a_fused_member_whose_loss_diverged_is_diverged_in_the_summary(tmp_path):
    """A member a fused group stopped for a NaN/inf loss (engine/segment.py's check_finite,
    which engine/loop.py calls for a fused step) is `diverged` in summary.csv, not
    `early_stopped` or `incomplete`, and the advice names it among the runs that did not
    finish."""
    from cifarflow.results.advice import advice

    reason = "diverged: train loss nan at epoch 1"
    history = timed(records([2.3, float("nan")]))
    wild = summarize_run("wild", write_run(tmp_path, "wild", history, {"early_stop": reason},
                                           early_stop={}))
    calm = summarize_run("calm", write_run(tmp_path, "calm", timed(records([2.0, 1.5, 1.2, 1.0,
                                                                             0.9, 0.8])), {}))
    assert (wild["status"], wild["early_stop"]) == ("diverged", reason)
    assert calm["status"] == "ok"
    tips = advice(pd.DataFrame([wild, calm]).assign(
        images_per_sec_per_core=100.0, cpus_per_task=1, gpu_util_pct=None))
    assert "wild: diverged (see results/logs/train/wild/)" in tips
