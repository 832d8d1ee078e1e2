"""Packed segments (pack.runs_per_job) through real local snakemake runs: one job trains
segment k of several sweep members, each equal to the same sweep unpacked."""

import os
import re
import signal

import pytest

from conftest import (assert_equal_to_unpacked, metrics_of, self_stopped, start_snakemake,
                      stop_at, summary_rows, sweep_config)
from test_tensorboard import assert_epoch_scalars
from cifarflow.engine.checkpoints import files as ckpt


@pytest.mark.slow  # with the 16-run unpacked sweep it is compared to: 70 s
def test_local_pack_equals_unpacked_and_retries_only_the_killed_member(tmp_path,
                                                                      unpacked_sweep):
    """4 runs in 2 packs of 2 under `snakemake --cores 2 --retries 1`, saving after every
    batch; one member stops itself right after its first in-segment save (batch 1) and is
    SIGKILLed there: its pack job fails once the other member finished, and the retry
    trains the killed member alone, from its own checkpoint, at batch 1. Final weights
    equal the unpacked sweep's."""
    config = sweep_config(tmp_path / "c.yaml", 4, 2, train="checkpoint_interval_s: 0.001")
    victim = "cpu_lr0p02"
    marker = tmp_path / "stopped.pid"
    proc = start_snakemake(tmp_path, "--cores", "2", "--retries", "1", configfile=config,
                           env=stop_at("save:1", f"runs/{victim}/segment-1", marker))
    pid = self_stopped(marker, proc)
    saved = ckpt.read_manifest(tmp_path / f"results/runs/{victim}/work")
    os.kill(pid, signal.SIGKILL)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, output[-4000:]
    assert (saved["epoch"], saved["step"], saved["done"]) == (0, 1, False), saved
    logs = tmp_path / "results/logs"
    retry = (logs / f"train/{victim}/segment-1.attempt2.log").read_text()
    assert (f"resumed from results/runs/{victim}/work at epoch 1, batch {saved['step']}\n"
            in retry), retry[-2000:]
    pack_log = (logs / "packs/cpu-pack001/segment-1.log").read_text()
    assert f"{victim}: started (attempt 2" in pack_log
    assert "cpu_lr0p01: segment 1 already published, not retrained" in pack_log
    assert sorted(p.name for p in (logs / f"train/{victim}").glob("segment-1.*")) == [
        "segment-1.attempt1.log", "segment-1.attempt2.log", "segment-1.log"]
    assert not list((logs / "train/cpu_lr0p01").glob("segment-1.attempt2.log"))
    rows = summary_rows(tmp_path)
    assert rows[victim]["attempts"] == "3" and rows["cpu_lr0p01"]["attempts"] == "2"
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert_equal_to_unpacked(tmp_path, unpacked_sweep)
    for run in rows:  # each member's TensorBoard curve, the killed one's retry included
        assert_epoch_scalars(tmp_path / f"results/tensorboard/{run}",
                             metrics_of(tmp_path / f"results/runs/{run}/segment-2"), 1000 // 100)


@pytest.mark.slow  # 4 packed runs and the 16-run unpacked sweep they are compared to
def test_a_member_stopped_early_gets_an_extra_segment_in_its_pack(tmp_path, unpacked_sweep):
    """In its last planned segment a pack member is stopped early: it stops itself at its
    first in-segment save inside epoch 2 (batch 1), and gets SIGUSR2 there (the stop a time
    limit gives): it trains one more batch and publishes segment 2 unfinished at batch 2,
    so the workflow gives it a third segment, which resumes at exactly that batch, in its
    pack's next job and alone in it; the other member is done after 2. Every run ends bit
    for bit as the same sweep unpacked."""
    config = sweep_config(tmp_path / "c.yaml", 4, 2, train="checkpoint_interval_s: 0.001")
    victim = "cpu_lr0p02"
    marker = tmp_path / "stopped.pid"
    proc = start_snakemake(tmp_path, "--cores", "2", configfile=config,
                           env=stop_at("save:1", f"runs/{victim}/segment-2", marker))
    pid = self_stopped(marker, proc)
    saved = ckpt.read_manifest(tmp_path / f"results/runs/{victim}/work")
    os.kill(pid, signal.SIGUSR2)
    os.kill(pid, signal.SIGCONT)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, output[-4000:]
    assert (saved["epoch"], saved["step"]) == (1, 1), saved
    published = ckpt.read_manifest(tmp_path / f"results/runs/{victim}/segment-2")
    assert (published["epoch"], published["step"], published["done"]) == (1, 2, False)
    third_try = (tmp_path / f"results/logs/train/{victim}/segment-3.log").read_text()
    assert re.search(rf"resumed from results/runs/{victim}/\S+ at epoch 2, batch 2\n",
                     third_try), third_try[-2000:]
    logs = tmp_path / "results/logs/packs"
    third = (logs / "cpu-pack001/segment-3.log").read_text()
    assert victim in third and "cpu_lr0p01" not in third, third
    assert not (logs / "cpu-pack002/segment-3.log").exists()
    assert not (tmp_path / "results/runs/cpu_lr0p01/segment-3").exists()
    rows = summary_rows(tmp_path)
    assert rows[victim]["segments"] == "3" and rows["cpu_lr0p01"]["segments"] == "2"
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert_equal_to_unpacked(tmp_path, unpacked_sweep)
