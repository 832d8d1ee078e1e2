"""Progress of a plan from its published segments (cifarflow/controller/progress.py): segments
trained for real by `cifarflow train`, where the workflow puts them, a pruning point
included."""

from conftest import SYNTHETIC, cli
from cifarflow.config import with_defaults
from cifarflow.layout import RunPaths
from cifarflow.controller.plan import build_runs
from cifarflow.controller.progress import PlanProgress, ProgressWatch

PRUNE = {"metric": "test_acc", "keep": 0.5, "at_segments": [1], "min_runs": 1}


def planned(results):
    """Two cpu runs of 2 epochs in 2 segments; after segment 1 the better one goes on."""
    config = with_defaults({
        "strategies": ["cpu"], "data": {"synthetic": SYNTHETIC}, "segments": {"count": 2},
        "train": {"epochs": 2, "batch_size": 100, "eval_batch_size": 400,
                  "log_interval_s": 1000},
        "sweep": {"lr": [0.05, 0.00001], "prune": PRUNE}})
    runs = build_runs(config)
    for run in runs.values():
        run.config.write(RunPaths(str(results), run.name).spec)
    return runs


def train_segment(cifar_dir, results, run, k):
    paths = RunPaths(str(results), run.name)
    resume = ["--resume", paths.segment(k - 1)] if k > 1 else []
    cli("train", "--spec", paths.spec, "--data", cifar_dir, "--out", paths.segment(k),
        "--work", paths.work, "--until-epoch", run.until_epoch(k), "--threads", 2, *resume)


def test_runs_segments_and_time_left_from_real_segments(cifar_dir, tmp_path):
    results = tmp_path / "results"
    runs = planned(results)
    good, bad = runs["cpu_lr0p05"], runs["cpu_lr1em05"]
    plan = PlanProgress(str(results), runs, PRUNE, max_segments=4)
    clock = iter([100.0, 130.0, 130.0, 190.0, 190.0])
    lines = []
    watch = ProgressWatch(plan, lines.append, active=lambda: True, clock=lambda: next(clock))

    assert watch.look() is None  # the first look notes what this invocation found
    before = plan.read()
    assert (before.runs_done, before.segments_done, before.segments, before.at_most) == \
        (0, 0, 4, True)  # nothing published; pruning may cut the plan

    train_segment(cifar_dir, results, good, 1)
    half = plan.read()  # the ranking needs both runs' segment 1: still undecided
    assert (half.runs_done, half.segments_done, half.segments, half.at_most) == (0, 1, 4, True)

    train_segment(cifar_dir, results, bad, 1)  # lr 1e-5 learns nothing: pruned after 1
    ranked = plan.read()
    assert (ranked.runs_done, ranked.segments_done, ranked.segments, ranked.at_most) == \
        (1, 2, 3, False)
    assert (ranked.epochs_done, ranked.epochs) == (2, 3)
    # 2 epochs in 30 s since the first look, 1 epoch left: 15 s
    assert watch.look() == "progress: 1 of 2 runs done, 2 of 3 segments; about 15.0s left " \
                           "at the current pace"
    assert watch.look() is None  # nothing changed: nothing said

    train_segment(cifar_dir, results, good, 2)
    assert watch.look() == "progress: 2 of 2 runs done, 3 of 3 segments"
    assert lines == [
        "progress: 1 of 2 runs done, 2 of 3 segments; about 15.0s left at the current pace",
        "progress: 2 of 2 runs done, 3 of 3 segments"]


def test_a_segment_that_stopped_early_adds_one(cifar_dir, tmp_path):
    """A segment stopped by its time budget before its target: the run needs one more
    segment than planned, and its time left counts the epochs it has still to train."""
    results = tmp_path / "results"
    config = with_defaults({
        "strategies": ["cpu"], "data": {"synthetic": SYNTHETIC}, "segments": {"count": 1},
        "train": {"epochs": 2, "batch_size": 100, "eval_batch_size": 400,
                  "log_interval_s": 1000}})
    runs = build_runs(config)
    run = runs["cpu"]
    run.config.write(RunPaths(str(results), "cpu").spec)
    paths = RunPaths(str(results), "cpu")
    cli("train", "--spec", paths.spec, "--data", cifar_dir, "--out", paths.segment(1),
        "--work", paths.work, "--until-epoch", 2, "--threads", 2, "--budget-min", 0.0001)
    plan = PlanProgress(str(results), runs, None, max_segments=3)
    now = plan.read()
    assert (now.runs_done, now.segments_done, now.segments) == (0, 1, 2)
    assert now.epochs == 2 and now.epochs_done < 2
