"""Requests that learn, in real local workflows: segment k+1 asks for what segment k used
(resources.autosize), and an error to fix is not retried for nothing."""

import json
import math

import pytest

from conftest import snakemake, summary_rows

CONFIG = ("strategies: [cpu]\ndata: {source: synthetic, synthetic: {train_size: 1000, "
          "test_size: 200}}\ntrain: {epochs: 2, batch_size: 100, log_interval_s: 100"
          "MODEL}\nsegments: {count: 2}\n"
          "resources: {cpus_per_task: 1, mem_mb: 6000, runtime: 30, autosize: AUTOSIZE}\n")


def tries_of(workdir, run="cpu"):
    """Every try's record in the segments' manifest, by segment."""
    meta = json.loads((workdir / f"results/runs/{run}/segment-2/checkpoint.json").read_text())
    return {t["segment"]: t for t in meta["segment_runs"]}


@pytest.mark.slow  # a two-segment workflow run: about 15 s
def test_autosize_asks_the_next_segment_for_what_the_last_one_used(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.replace("MODEL", "").replace("AUTOSIZE", "true"))
    out = snakemake(tmp_path, "--cores", "1", configfile=config)
    first, second = tries_of(tmp_path)["segment-1"], tries_of(tmp_path)["segment-2"]
    assert (first["requested_mem_mb"], first["requested_runtime_min"]) == (6000, 30)
    # segment 2: the peak of segment 1 x 1.3, rounded up to 100 MB; its wall time for one
    # epoch x 1.3 and the engine's stop margin (runtime - 60 s), in whole minutes, never
    # below resources.autosize_min_runtime (10)
    peak = max(first["peak_rss_mb_per_node"].values())
    mem = max(256, 100 * math.ceil(peak * 1.3 / 100))
    minutes = max(10, math.ceil((first["wall_s"] * 1.3 + 60) / 60))
    assert (second["requested_mem_mb"], second["requested_runtime_min"]) == (mem, minutes)
    assert mem < 6000 and minutes < 30
    assert f"cpu segment 2: autosize from the previous segment: memory {mem} MB" in out.stderr
    log = (tmp_path / "results/logs/train/cpu/segment-2.log").read_text()
    assert f"request: {mem} MB per node, {minutes} min" in log
    row = summary_rows(tmp_path)["cpu"]
    assert (row["mem_requested_mb"], row["mem_requested_last_mb"]) == ("6000", str(mem))
    assert row["runtime_requested_last_min"] == str(minutes)
    assert row["try_ends"] == "completed 2"


REFUSING_MODEL = '''import sys
import torch


def net():
    """Builds for the plan's check, refuses inside `cifarflow train`: an error to fix."""
    if sys.argv[1:2] == ["train"]:
        raise ValueError("this model refuses to train")
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
'''


@pytest.mark.slow
def test_an_error_to_fix_fails_once_and_its_retries_do_not_train(tmp_path):
    (tmp_path / "refusing.py").write_text(REFUSING_MODEL)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.replace("MODEL", ", model: 'refusing:net', channels_last: false")
                      .replace("AUTOSIZE", "false"))
    out = snakemake(tmp_path, "--cores", "1", "--retries", "2", configfile=config, check=False)
    assert out.returncode != 0
    logs = tmp_path / "results/logs/train/cpu"
    first = (logs / "segment-1.attempt1.log").read_text()
    assert "cifarflow train: error: this model refuses to train" in first
    for attempt in (2, 3):  # Snakemake's retries end before any training
        retry = (logs / f"segment-1.attempt{attempt}.log").read_text()
        assert ("segment 1: attempt 1 failed with an error to fix, not a fault of the node, the "
                "time limit or memory: ValueError: this model refuses to train; not retried"
                ) in retry, retry
        assert "model=" not in retry and "request:" not in retry
    records = [json.loads(line) for line in
               (tmp_path / "results/runs/cpu/tries.jsonl").read_text().splitlines()]
    assert [(r["event"], r.get("ended")) for r in records] == [("start", None), ("end", "error")]
    # the user's next run of the workflow is a new invocation: it trains (and fails) again
    again = snakemake(tmp_path, "--cores", "1", configfile=config, check=False)
    assert again.returncode != 0
    rerun = (logs / "segment-1.attempt1.log").read_text()
    assert "this model refuses to train" in rerun and "not retried" not in rerun
