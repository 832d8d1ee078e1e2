"""Fused packs (pack.fuse): K members trained in one process as one fused model, through the
real `cifarflow train-fused` / `train` commands on CPU.

What is proven here: in `loop` fusion (the CPU default) each member ends bit-identical to
the same member trained alone (its own seed, batches and hyper-parameters: lr, optimizer,
momentum, weight decay, schedule), so a weight decay of 5e-4 is as visible as it is alone;
in `vmap` fusion (grouped convolutions, as on CUDA) within a stated tolerance; BatchNorm
running statistics per member; one shared input batch on and off giving the same weights;
fused K-segment training bit-identical to one segment (stops inside an epoch included),
members resuming at different points, a member's checkpoint going on unfused, and a
diverging member stopped without touching the others."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import (ENV, PY, ROOT, SYNTHETIC, assert_bit_identical, assert_equal_to_unpacked,
                      cli, metrics_of, self_stopped, snakemake, state_of, stop_at, summary_rows,
                      sweep_config, weights_digest)

from cifarflow.engine.checkpoints.files import read_manifest
from cifarflow.config import TrainConfig, with_defaults
from cifarflow.layout import RunPaths
from cifarflow.controller.plan import build_runs

# vmap fusion and alone differ by float rounding: grouped (or, over a shared batch, dense)
# convolutions sum in another order than K plain ones. After 20-40 steps every weight is within:
ATOL, RTOL = 2e-4, 2e-3
MODELS = {**ENV, "PYTHONPATH": f"{ENV['PYTHONPATH']}:{ROOT / 'tests' / 'integration'}"}
BN_MODEL = "fused_models:small_bn_net"  # tests/integration/fused_models.py


def plan(results: Path, sweep: dict, tta: str = "none", **train) -> list[str]:
    """The sweep's runs planned as the workflow plans them, their specs written."""
    config = with_defaults({"strategies": ["cpu"], "data": {"synthetic": SYNTHETIC},
                            "train": {"epochs": 2, "batch_size": 100, "eval_batch_size": 400,
                                      "log_interval_s": 1000, **train},
                            "eval": {"tta": tta}, "sweep": sweep})
    runs = build_runs(config)
    for name, run in runs.items():
        run.config.write(RunPaths(str(results), name).spec)
    return list(runs)


def train_fused(results: Path, data: Path, runs: list[str], k: int = 1, until: int = 2,
                mode: str = "loop", budget_min: float = 60, check: bool = True,
                shared: bool = True, said: list | None = None) -> dict:
    """The members' status; what the process said is appended to ``said``."""
    status = results / f"status-{k}.json"
    out = cli("train-fused", "--pack", "p", "--segment", k, "--results", results, "--data", data,
        "--until-epoch", until, "--threads", 2, "--budget-min", budget_min, "--mode", mode,
        "--status", status, *([] if shared else ["--no-shared-input"]), "--members", *runs,
        env=MODELS, check=check)
    if said is not None:
        said.append(out.stdout + out.stderr)
    return json.loads(status.read_text())


def train_alone(results: Path, data: Path, run: str, k: int = 1, until: int = 2) -> None:
    paths = RunPaths(str(results), run)
    args = ["train", "--spec", paths.spec, "--data", data, "--out", paths.segment(k),
            "--work", paths.work, "--until-epoch", until, "--threads", 2]
    if k > 1:
        args += ["--resume", paths.segment(k - 1)]
    cli(*args, env=MODELS)


def segment(results: Path, run: str, k: int) -> Path:
    return Path(RunPaths(str(results), run).segment(k))


def assert_close(fused: dict, alone: dict, what: str = "") -> None:
    assert fused.keys() == alone.keys()
    for key, value in alone.items():
        if value.is_floating_point():
            assert torch.allclose(fused[key], value, rtol=RTOL, atol=ATOL), \
                f"{what} {key}: max difference {(fused[key] - value).abs().max():.2e}"
        else:
            assert torch.equal(fused[key], value), key


BN_VMAP_TOL = 1e-2  # vmap against alone, each tensor's largest gap over its largest value


def largest_gaps(fused: dict, alone: dict) -> dict[str, float]:
    """Each floating tensor's largest gap between fused and alone, over its largest value
    (at least 1); integer tensors must be equal."""
    assert fused.keys() == alone.keys()
    gaps = {}
    for key, value in alone.items():
        if value.is_floating_point():
            scale = max(1.0, value.abs().max().item())
            gaps[key] = (fused[key] - value).abs().max().item() / scale
        else:
            assert torch.equal(fused[key], value), key
    return gaps


def assert_same_optimizer_state(a: dict, b: dict) -> None:
    """Optimizer state dicts, bit for bit: a state for every parameter, the same keys."""
    assert sorted(a) == sorted(b)
    for index in b:
        assert a[index].keys() == b[index].keys(), index
        for key in b[index]:
            assert torch.equal(a[index][key], b[index][key]), (index, key)


def test_members_train_as_alone_each_with_its_own_hyperparameters(tmp_path, cifar_dir):
    """Six members, every one with other hyper-parameters (SGD with momentum and weight
    decay, the same without weight decay, SGD without momentum, Adam with a onecycle schedule
    and with L2 weight decay, another seed), fused in one process (loop): each ends bit for
    bit as itself trained alone (weights, optimizer state, lr, losses), with a checkpoint
    in the unfused format; the weight decay of 5e-4 is visible against its twin without."""
    fused_dir, alone_dir = tmp_path / "fused", tmp_path / "alone"
    sweeps = [{"lr": [0.05], "weight_decay": [0.0005], "scheduler": ["cosine"]},
              {"lr": [0.05], "scheduler": ["cosine"]},
              {"lr": [0.02], "momentum": [0.0], "seed": [3]},
              {"lr": [0.002], "optimizer": ["adam"], "scheduler": ["onecycle"]},
              {"lr": [0.002], "optimizer": ["adam"], "weight_decay": [0.001]},
              {"lr": [0.1], "seed": [7]}]
    runs = [name for sweep in sweeps for name in plan(fused_dir, sweep)]
    for sweep in sweeps:
        plan(alone_dir, sweep)
    assert len(set(runs)) == 6
    status = train_fused(fused_dir, cifar_dir, runs)
    assert {run: (s["exit"], s["done"], s["epoch"]) for run, s in status.items()} == {
        run: (0, True, 2) for run in runs}
    for run in runs:
        train_alone(alone_dir, cifar_dir, run)
        fused, alone = state_of(segment(fused_dir, run, 1)), state_of(segment(alone_dir, run, 1))
        assert_bit_identical(fused["model"], alone["model"])
        # the fused member's digest, computed on its view of the flat row, is the alone one's
        assert weights_digest(segment(fused_dir, run, 1)) == weights_digest(segment(alone_dir, run, 1))
        assert_same_optimizer_state(fused["optimizer"]["state"], alone["optimizer"]["state"])
        assert fused["optimizer"]["param_groups"][0]["lr"] == pytest.approx(
            alone["optimizer"]["param_groups"][0]["lr"], rel=1e-12)
        fm, am = metrics_of(segment(fused_dir, run, 1)), metrics_of(segment(alone_dir, run, 1))
        assert [r["epoch"] for r in fm] == [1, 2]
        assert [(r["train_loss"], r["train_acc"], r["test_acc"]) for r in fm] == \
            [(r["train_loss"], r["train_acc"], r["test_acc"]) for r in am]
        for f, a in zip(fm, am):
            assert f["lr"] == pytest.approx(a["lr"], rel=1e-12)
            assert f["started_at"] <= f["ended_at"]  # the group's training window
        log = Path(RunPaths(str(fused_dir), run).log(1)).read_text()
        assert f"[{run}]" in log and "epoch 2/2 loss" in log
    decayed, plain = (state_of(segment(fused_dir, run, 1))["model"] for run in runs[:2])
    assert "wd0p0005" in runs[0] and "wd" not in runs[1]
    assert max((decayed[k] - plain[k]).abs().max() for k in plain) > 1e-5


@pytest.mark.slow  # 8 fused trainings: about 40 s
@pytest.mark.variant
def test_shared_input_on_and_off_gives_the_same_weights(tmp_path, cifar_dir):
    """Members with one seed share one gathered batch (the pack log says so); gathering each
    member's own copy instead gives the same weights: bit for bit in loop fusion, within
    tolerance in vmap fusion (there conv1 becomes one dense convolution)."""
    sweep = {"lr": [0.02, 0.05], "weight_decay": [0.0, 0.0005]}
    runs = plan(tmp_path / "shared-loop", sweep, epochs=1)
    states = {}
    for mode in ("loop", "vmap"):
        for shared in (True, False):
            results = tmp_path / f"{'shared' if shared else 'own'}-{mode}"
            plan(results, sweep, epochs=1)
            train_fused(results, cifar_dir, runs, until=1, mode=mode, shared=shared)
            states[mode, shared] = {run: state_of(segment(results, run, 1))["model"]
                                    for run in runs}
    for run in runs:
        assert_bit_identical(states["loop", True][run], states["loop", False][run])
        assert_close(states["vmap", True][run], states["vmap", False][run], f"{run} vmap")


def test_augmented_members_with_label_smoothing_and_tta_train_as_alone(tmp_path, cifar_dir):
    """train.augment (flip, crop), label smoothing and test-time flip in fused groups, in two
    segments: members of one seed (one shared batch, augmented once) and of two seeds (each
    member its own draws, applied in one go) end bit for bit as each alone in one segment,
    test_acc_tta included."""
    sweep = {"lr": [0.03, 0.06], "seed": [0, 5]}
    train = dict(augment={"flip": True, "crop": 2}, label_smoothing=0.1, tta="flip")
    runs = plan(tmp_path / "alone", sweep, **train)
    one_seed = [run for run in runs if "seed0" in run]
    assert len(one_seed) == 2 and len(runs) == 4
    said = {}
    for name, members in (("shared", one_seed), ("own", runs)):
        plan(tmp_path / name, sweep, **train)
        said[name] = []
        train_fused(tmp_path / name, cifar_dir, members, k=1, until=1, said=said[name])
        train_fused(tmp_path / name, cifar_dir, members, k=2, until=2, said=said[name])
    assert "one batch shared by all members (same order)" in said["shared"][0]
    assert "each member its own batch order (seeds differ)" in said["own"][0]
    for run in runs:
        train_alone(tmp_path / "alone", cifar_dir, run, k=1, until=2)
        alone = state_of(segment(tmp_path / "alone", run, 1))["model"]
        am = metrics_of(segment(tmp_path / "alone", run, 1))
        assert all(0 <= r["test_acc_tta"] <= 1 for r in am)
        for name in ("shared", "own") if run in one_seed else ("own",):
            assert_bit_identical(state_of(segment(tmp_path / name, run, 2))["model"], alone)
            fm = metrics_of(segment(tmp_path / name, run, 2))
            assert [(r["train_loss"], r["test_acc"], r["test_acc_tta"]) for r in fm] == \
                [(r["train_loss"], r["test_acc"], r["test_acc_tta"]) for r in am], (name, run)


@pytest.mark.slow
@pytest.mark.variant
def test_batchnorm_members_keep_their_own_running_statistics(tmp_path, cifar_dir):
    """A user's model with BatchNorm: each member's running mean/var and batch count are
    its own, as the member alone: bit for bit in loop fusion, within tolerance in vmap
    fusion (grouped convolutions and BatchNorm over the concatenated channels, as on CUDA;
    each member's own batch: at lr 0.2 the dense convolution of a shared batch rounds
    differently enough for this net to leave the tolerance, 5e-3 after 20 steps). The
    tolerance is relative to each tensor's scale: 20 steps at lr 0.2 leave the grouped
    convolution's rounding 1.7e-3 (absolute) from the dense one on one CPU and ~0 on
    another, whichever kernels the CPU has (AMX or not)."""
    runs = plan(tmp_path / "loop", {"lr": [0.02, 0.2]}, model=BN_MODEL, epochs=1)
    gaps = []
    for mode in ("loop", "vmap"):
        plan(tmp_path / mode, {"lr": [0.02, 0.2]}, model=BN_MODEL, epochs=1)
        train_fused(tmp_path / mode, cifar_dir, runs, until=1, mode=mode, shared=mode == "loop")
    plan(tmp_path / "alone", {"lr": [0.02, 0.2]}, model=BN_MODEL, epochs=1)
    means = []
    for run in runs:
        train_alone(tmp_path / "alone", cifar_dir, run, until=1)
        alone = state_of(segment(tmp_path / "alone", run, 1))["model"]
        assert_bit_identical(state_of(segment(tmp_path / "loop", run, 1))["model"], alone)
        fused = state_of(segment(tmp_path / "vmap", run, 1))["model"]
        gaps.append(largest_gaps(fused, alone))
        assert int(fused["bn.num_batches_tracked"]) == 20
        means.append(alone["bn.running_mean"])
    # vmap: each tensor within BN_VMAP_TOL of its largest value; the members' statistics
    # differ by far more, so statistics shared or swapped between them could not pass
    assert all(gap <= BN_VMAP_TOL for run_gaps in gaps for gap in run_gaps.values()), gaps
    between = (means[0] - means[1]).abs().max() / means[1].abs().max()
    assert between > 10 * BN_VMAP_TOL, between


def stopped_inside_an_epoch(results: Path, data: Path, runs: list[str]) -> dict:
    """Segment 1 of a fused group stopped by SIGUSR2 inside epoch 1: the process stops
    itself right after the first in-segment save (batch 1) of runs[0], gets the signal
    there, trains one more batch and publishes every member at batch 2; its status."""
    status = results / "status-1.json"
    marker = results / "stopped.pid"
    proc = subprocess.Popen([PY, "-m", "cifarflow", "train-fused", "--pack", "p", "--segment",
                             "1", "--results", str(results), "--data", str(data),
                             "--until-epoch", "2", "--threads", "2", "--budget-min", "60",
                             "--mode", "loop", "--status", str(status), "--members", *runs],
                            env={**MODELS, **stop_at("save:1", f"{runs[0]}/segment-1", marker)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        self_stopped(marker, proc)
        saved = read_manifest(Path(RunPaths(str(results), runs[0]).work))
        os.kill(proc.pid, signal.SIGUSR2)
        os.kill(proc.pid, signal.SIGCONT)
        out = proc.communicate(timeout=600)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert (saved["epoch"], saved["step"]) == (0, 1), saved
    for run in runs:  # exactly one batch after the save it stopped at
        manifest = read_manifest(segment(results, run, 1))
        assert (manifest["epoch"], manifest["step"], manifest["done"]) == (0, 2, False), manifest
    marker.unlink()  # a later stop may claim it again
    return json.loads(status.read_text())


@pytest.mark.slow  # 6 fused trainings of 2 members: 90 s on a quiet machine
def test_fused_segments_are_bit_identical_to_one_segment(tmp_path, cifar_dir):
    """Fused, 2 epochs in one segment == epoch 1, then epoch 2 == a segment stopped inside
    epoch 1 (SIGUSR2 at its first in-segment save, where the process stopped itself), then
    the rest, resumed at exactly batch 2. Every member's weights (and weights_sha256),
    optimizer state and metrics, bit for bit."""
    sweep = {"lr": [0.03, 0.08], "optimizer": ["sgd", "adam"]}
    for name in ("one", "two"):
        runs = plan(tmp_path / name, sweep)
    plan(tmp_path / "stopped", sweep, checkpoint_interval_s=0.001)
    train_fused(tmp_path / "one", cifar_dir, runs)
    train_fused(tmp_path / "two", cifar_dir, runs, k=1, until=1)
    train_fused(tmp_path / "two", cifar_dir, runs, k=2, until=2)
    first = stopped_inside_an_epoch(tmp_path / "stopped", cifar_dir, runs)
    said = []
    first = train_fused(tmp_path / "stopped", cifar_dir, runs, k=2, until=2, said=said)
    assert "fused group of 4 (loop) on cpu, from epoch 1 batch 2" in said[0], said[0]
    assert all(first[run]["done"] for run in runs)
    for run in runs:
        one = state_of(segment(tmp_path / "one", run, 1))
        for other, last in (("two", 2), ("stopped", 2)):
            state = state_of(segment(tmp_path / other, run, last))
            assert_bit_identical(state["model"], one["model"])
            assert weights_digest(segment(tmp_path / other, run, last)) == \
                weights_digest(segment(tmp_path / "one", run, 1))
            assert_same_optimizer_state(state["optimizer"]["state"], one["optimizer"]["state"])
            assert [r["train_loss"] for r in metrics_of(segment(tmp_path / other, run, last))] \
                == [r["train_loss"] for r in metrics_of(segment(tmp_path / "one", run, 1))]


@pytest.mark.slow  # 3 vmap fused trainings of 2 members: about 25 s of CPU
def test_vmap_fused_segments_equal_one_segment_within_tolerance(tmp_path, cifar_dir):
    """vmap fusion (grouped convolutions, as on CUDA), 2 epochs in one segment against epoch
    1, then epoch 2 in a second segment resumed from the members' unfused checkpoints: the
    same weights within ATOL/RTOL (the flat buffers round-trip through the checkpoints
    exactly, so on one machine they are equal bit for bit), the same accuracies."""
    sweep = {"lr": [0.03], "optimizer": ["sgd", "adam"]}
    for name in ("one", "two"):
        runs = plan(tmp_path / name, sweep)
    train_fused(tmp_path / "one", cifar_dir, runs, mode="vmap")
    train_fused(tmp_path / "two", cifar_dir, runs, k=1, until=1, mode="vmap")
    train_fused(tmp_path / "two", cifar_dir, runs, k=2, until=2, mode="vmap")
    for run in runs:
        one, two = segment(tmp_path / "one", run, 1), segment(tmp_path / "two", run, 2)
        assert_close(state_of(two)["model"], state_of(one)["model"], f"{run} vmap")
        assert [(r["epoch"], r["test_acc"]) for r in metrics_of(two)] == \
            [(r["epoch"], r["test_acc"]) for r in metrics_of(one)]
        assert [r["train_loss"] for r in metrics_of(two)] == \
            pytest.approx([r["train_loss"] for r in metrics_of(one)], rel=RTOL)


@pytest.mark.slow  # a frozen stop, 4 fused segments and 2 alone: about 45 s
@pytest.mark.variant
def test_members_resuming_at_different_points_train_as_one_group_per_point(tmp_path, cifar_dir):
    """Segment 2 of a fused pack whose members ended segment 1 at different points (A
    stopped inside epoch 1 at its in-segment save, B at the end of epoch 1): the process
    says so, trains one group per point, one after the other, and each member ends bit
    for bit as itself trained alone in one go."""
    first, second = plan(tmp_path / "fused", {"lr": [0.03, 0.06]}, checkpoint_interval_s=0.001)
    plan(tmp_path / "alone", {"lr": [0.03, 0.06]})
    train_fused(tmp_path / "fused", cifar_dir, [second], k=1, until=1)
    stopped_inside_an_epoch(tmp_path / "fused", cifar_dir, [first])
    said = []
    status = train_fused(tmp_path / "fused", cifar_dir, [first, second], k=2, until=2,
                         said=said)
    assert "members resume at 2 different points" in said[0], said[0]
    assert said[0].count("fused group of 1 (loop)") == 2
    assert {run: (s["done"], s["epoch"]) for run, s in status.items()} == {
        first: (True, 2), second: (True, 2)}
    for run in (first, second):
        train_alone(tmp_path / "alone", cifar_dir, run, k=1, until=2)
        assert_bit_identical(state_of(segment(tmp_path / "fused", run, 2))["model"],
                             state_of(segment(tmp_path / "alone", run, 1))["model"])


@pytest.mark.slow
def test_a_member_goes_on_unfused_from_its_fused_checkpoint(tmp_path, cifar_dir):
    """Segment 1 fused, segment 2 alone (`cifarflow train --resume`): the checkpoint is
    the unfused format (schedule position and optimizer state included); the result is bit
    for bit that of 2 fused segments."""
    runs = plan(tmp_path / "mixed", {"lr": [0.05, 0.1]})
    plan(tmp_path / "fused", {"lr": [0.05, 0.1]})
    train_fused(tmp_path / "mixed", cifar_dir, runs, k=1, until=1)
    train_fused(tmp_path / "fused", cifar_dir, runs, k=1, until=1)
    train_fused(tmp_path / "fused", cifar_dir, runs, k=2, until=2)
    for run in runs:
        train_alone(tmp_path / "mixed", cifar_dir, run, k=2, until=2)
        mixed, fused = state_of(segment(tmp_path / "mixed", run, 2)), \
            state_of(segment(tmp_path / "fused", run, 2))
        assert_bit_identical(mixed["model"], fused["model"])
        assert_same_optimizer_state(mixed["optimizer"]["state"], fused["optimizer"]["state"])


@pytest.mark.parametrize("mode", ["loop", pytest.param("vmap", marks=pytest.mark.slow)])
def test_a_diverging_member_stops_alone(tmp_path, cifar_dir, mode):
    """A member whose loss turns NaN/inf leaves the group at the epoch's end: its run is
    done and says why (manifest, log), and the others end as in a fused group that never
    had it: bit for bit in loop fusion; in vmap fusion, where its NaN weights are in the
    same grouped convolution as theirs, within tolerance (a NaN would fail it)."""
    # weight decay 7 at lr 1 multiplies the weights by -6 a step: inf within the first epoch
    calm = plan(tmp_path / "with", {"lr": [0.02, 0.05]}, model=BN_MODEL)
    wild, = plan(tmp_path / "with", {"lr": [1.0], "weight_decay": [7.0]}, model=BN_MODEL)
    runs = [calm[0], wild, calm[1]]
    plan(tmp_path / "without", {"lr": [0.02, 0.05]}, model=BN_MODEL)
    status = train_fused(tmp_path / "with", cifar_dir, runs, mode=mode)
    train_fused(tmp_path / "without", cifar_dir, calm, mode=mode)
    assert all(status[run]["exit"] == 0 and status[run]["done"] for run in runs)
    manifest = read_manifest(segment(tmp_path / "with", wild, 1))
    assert manifest["done"] and manifest["early_stop"].startswith("diverged: train loss")
    assert manifest["epoch"] == 1  # it left after its first epoch
    assert not math.isfinite(metrics_of(segment(tmp_path / "with", wild, 1))[-1]["train_loss"])
    assert "diverged" in Path(RunPaths(str(tmp_path / "with"), wild).log(1)).read_text()
    for run in calm:
        with_it, without = (state_of(segment(tmp_path / group, run, 1))["model"]
                            for group in ("with", "without"))
        if mode == "loop":
            assert_bit_identical(with_it, without)
        else:
            assert_close(with_it, without, run)


def test_early_stop_ends_one_member_of_a_fused_group(tmp_path, cifar_dir):
    """train.early_stop in a fused group stops that member only: it is done at its early
    epoch, the other trains on, bit-identical to a group without it."""
    never_good_enough = {"enabled": True, "patience": 1, "min_delta": 100.0}
    stopper, = plan(tmp_path / "with", {"lr": [0.03]}, epochs=3, early_stop=never_good_enough)
    other, = plan(tmp_path / "with", {"lr": [0.06]}, epochs=3)
    plan(tmp_path / "without", {"lr": [0.06]}, epochs=3)
    status = train_fused(tmp_path / "with", cifar_dir, [stopper, other], until=3)
    train_fused(tmp_path / "without", cifar_dir, [other], until=3)
    assert (status[stopper]["done"], status[stopper]["epoch"]) == (True, 2)
    assert (status[other]["done"], status[other]["epoch"]) == (True, 3)
    said = read_manifest(segment(tmp_path / "with", stopper, 1))["early_stop"]
    assert said.startswith("early stop: ") and "has not improved by more than 100 for 1 " \
        "epoch(s)" in said, said
    assert_bit_identical(state_of(segment(tmp_path / "with", other, 1))["model"],
                         state_of(segment(tmp_path / "without", other, 1))["model"])


def test_a_member_whose_checkpoint_is_refused_fails_alone(tmp_path, cifar_dir):
    """Segment 2 of a fused pack where one member's config changed since segment 1 (its
    lr): that member fails with the refusal and exit status 2 in the status file, its
    log says why; the other trains segment 2 as if alone in the group."""
    runs = plan(tmp_path, {"lr": [0.03, 0.06]})
    train_fused(tmp_path, cifar_dir, runs, k=1, until=1)
    changed = TrainConfig.read(Path(RunPaths(str(tmp_path), runs[1]).spec))
    changed = TrainConfig.from_dict({**changed.to_dict(), "lr": 0.5})
    changed.write(RunPaths(str(tmp_path), runs[1]).spec)
    status = train_fused(tmp_path, cifar_dir, runs, k=2, until=2, check=False)
    assert status[runs[0]]["exit"] == 0 and status[runs[0]]["epoch"] == 2
    assert status[runs[1]]["exit"] == 2
    assert "refusing to resume" in status[runs[1]]["error"]
    assert "refusing to resume" in Path(RunPaths(str(tmp_path), runs[1]).log(2)).read_text()
    assert not segment(tmp_path, runs[1], 2).exists()


@pytest.mark.slow  # a local workflow of 4 runs, and the 16-run unpacked sweep it is compared to
def test_a_fused_sweep_through_the_workflow(tmp_path, unpacked_sweep):
    """`snakemake --cores 2` of 4 runs in fused packs of 2, 2 segments: each pack segment is
    one `train-fused` process; every run has its segments, logs, summary row, and ends
    bit for bit as the same run unpacked."""
    config = sweep_config(tmp_path / "c.yaml", 4, 2)
    config.write_text(config.read_text().replace("pack: {runs_per_job: 2}",
                                                 "pack: {runs_per_job: 2, fuse: true}"))
    dry = snakemake(tmp_path, "-n", configfile=config)
    assert "pack.fuse: 4 runs in 2 fused pack(s) (lenet bs 100: 2)" in dry.stdout + dry.stderr
    snakemake(tmp_path, "--cores", "2", configfile=config)
    pack_log = (tmp_path / "results/logs/packs/cpu-pack001/segment-2.log").read_text()
    assert "2 member(s) fused in one process" in pack_log
    assert "fused group of 2 (loop) on cpu, from epoch 2 batch 0" in pack_log
    rows = summary_rows(tmp_path)
    assert sorted(rows) == ["cpu_lr0p01", "cpu_lr0p02", "cpu_lr0p03", "cpu_lr0p04"]
    assert {row["status"] for row in rows.values()} == {"ok"}
    assert {row["segments"] for row in rows.values()} == {"2"}
    assert_equal_to_unpacked(tmp_path, unpacked_sweep)
    for run in rows:
        logs = tmp_path / "results/logs/train" / run
        assert (logs / "segment-2.log").resolve().name == "segment-2.attempt1.log"
