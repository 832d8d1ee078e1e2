"""Successive halving between segments (sweep.prune): a real sweep through snakemake,
unpacked and in packs."""

import json

import pytest

from conftest import (ROOT, assert_bit_identical, cli, metrics_of, run_batches, snakemake,
                      state_of, summary_rows)


CONFIG = ROOT / "tests" / "configs" / "prune" / "config.yaml"
pytestmark = pytest.mark.slow  # every test reads one 8-run sweep (40 s here)


def last_test_acc(work, run, segment):
    return metrics_of(work / f"results/runs/{run}/segment-{segment}")[-1]["test_acc"]


@pytest.fixture(scope="module")
def pruned_sweep(tmp_path_factory):
    work = tmp_path_factory.mktemp("prune")
    dry = snakemake(work, "-n", configfile=CONFIG)
    out = snakemake(work, "--cores", 2, configfile=CONFIG)
    return work, dry.stdout + dry.stderr, out.stdout + out.stderr


def test_dry_run_plans_up_to_the_first_pruning_point(pruned_sweep):
    _, dry, _ = pruned_sweep
    assert "ranked on test_acc after segment(s) 1, 2" in dry
    assert "segment=1" in dry and "segment=2" not in dry and "segment=3" not in dry


def test_each_pruning_point_keeps_the_better_half(pruned_sweep):
    work, _, _ = pruned_sweep
    rows = summary_rows(work)
    runs = sorted(rows)
    assert len(runs) == 8
    reached = {run: max(int(p.name.split("-")[1]) for p in
                        (work / f"results/runs/{run}").glob("segment-*")) for run in runs}
    assert sorted(reached.values()) == [1, 1, 1, 1, 2, 2, 3, 3]  # 8 -> 4 -> 2
    for point, alive in ((1, runs), (2, [r for r in runs if reached[r] >= 2])):
        going_on = [r for r in alive if reached[r] > point]
        stopped = [r for r in alive if reached[r] == point]
        assert min(last_test_acc(work, r, point) for r in going_on) >= \
            max(last_test_acc(work, r, point) for r in stopped)
        for r in stopped:
            assert (rows[r]["status"], rows[r]["pruned_at"], rows[r]["segments"]) == \
                ("pruned", str(point), str(point))
    for r in (r for r in runs if reached[r] == 3):
        assert (rows[r]["status"], rows[r]["segments"], rows[r]["epochs"]) == ("ok", "3", "3")
    advice = (work / "results/advice.md").read_text()
    assert "cpu: pruning stopped 6 of 8 runs early (at segments 1, 2): 10 segments, 10 epochs" in advice
    best = min((r for r in runs if reached[r] == 3), key=lambda r: (-float(rows[r]["test_acc"]), r))
    assert f"cpu: winner {best}," in advice


def test_the_winner_is_bit_identical_to_the_same_run_without_pruning(pruned_sweep, tmp_path):
    work, _, _ = pruned_sweep
    rows = summary_rows(work)
    winner = min((r for r in rows if rows[r]["status"] == "ok"),
                 key=lambda r: (-float(rows[r]["test_acc"]), r))
    cli("train", "--spec", work / f"results/runs/{winner}/spec.json", "--data",
        run_batches(work, winner), "--out", tmp_path / "whole", "--threads", 1)
    assert_bit_identical(state_of(work / f"results/runs/{winner}/segment-3")["model"],
                         state_of(tmp_path / "whole")["model"])


@pytest.mark.variant  # a pack equals its runs unpacked: tests/integration/test_pack.py
def test_packed_pruning_trains_the_same_segments_as_unpacked(pruned_sweep, tmp_path):
    """The same sweep in packs of 4: a pack's segment job after a pruning point trains its
    survivors only, a pack without survivors submits nothing, and every run ends where it
    ended unpacked, with the same weights."""
    work, _, _ = pruned_sweep
    packed = tmp_path / "packed.yaml"
    packed.write_text(CONFIG.read_text() + "pack: {runs_per_job: 4}\n")
    snakemake(tmp_path, "--cores", 2, configfile=packed)
    unpacked, rows = summary_rows(work), summary_rows(tmp_path)
    for run, row in unpacked.items():
        assert (rows[run]["status"], rows[run]["segments"], rows[run]["pruned_at"]) == \
            (row["status"], row["segments"], row["pruned_at"]), run
        last = tmp_path / f"results/runs/{run}/segment-{row['segments']}"
        assert_bit_identical(state_of(last)["model"],
                             state_of(work / f"results/runs/{run}/segment-{row['segments']}")["model"])
    for record in (tmp_path / "results/packs").glob("*/segment-*.json"):
        k = int(record.stem.split("-")[1])
        members = json.loads(record.read_text())["members"]
        packed_runs = json.loads((record.parent / "segment-1.json").read_text())["members"]
        # exactly the pack's runs that the unpacked sweep trained to segment k: none dropped
        # while it still trains, none trained past its pruning
        assert sorted(members) == sorted(r for r in packed_runs
                                         if int(unpacked[r]["segments"]) >= k), record
        assert members, record  # no job without a member
    trained = sorted(len(json.loads(r.read_text())["members"])
                     for r in (tmp_path / "results/packs").glob("*/segment-*.json"))
    assert sum(trained) == 8 + 4 + 2


def test_without_pruning_a_pruned_run_resumes_to_the_end(pruned_sweep, tmp_path):
    """Last in this file: it trains the pruned sweep's runs on (the tests above read it)."""
    work, _, _ = pruned_sweep
    rows = summary_rows(work)
    pruned = sorted(r for r in rows if rows[r]["pruned_at"] == "1")[0]
    unpruned = tmp_path / "unpruned.yaml"
    unpruned.write_text("".join(l for l in CONFIG.read_text().splitlines(keepends=True)
                                if "prune:" not in l))
    # a finished summary is not re-planned by itself: ask for it again
    snakemake(work, "--cores", 2, "--forcerun", "aggregate_results", configfile=unpruned)
    rows = summary_rows(work)
    assert (rows[pruned]["status"], rows[pruned]["epochs"], rows[pruned]["pruned_at"]) == \
        ("ok", "3", "")
    log = (work / f"results/logs/train/{pruned}/segment-2.log").read_text()
    assert f"resumed from results/runs/{pruned}/segment-1 at epoch 2, batch 0" in log
