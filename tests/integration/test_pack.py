"""Packed segments (pack.runs_per_job) through real local snakemake runs: one job trains
segment k of several sweep members, each equal to the same sweep unpacked."""

import os
import signal
import time

import pytest

from conftest import (assert_bit_identical, cmdline, final_states, metrics_of, process_tree,
                      start_snakemake, summary_rows, sweep_config, train_until_saved,
                      training_spec)
from test_tensorboard import assert_epoch_scalars


def member_process(proc, run: str, segment: int, timeout: float = 300) -> int | None:
    """The pid of ``run``'s training process for ``segment`` once the snakemake ``proc``
    started it (None if it never did, or snakemake ended first)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        for pid in process_tree(proc.pid):
            if training_spec(pid) == f"results/runs/{run}/spec.json" and \
                    f"runs/{run}/segment-{segment}" in cmdline(pid):
                return pid
        time.sleep(0.01)
    return None


@pytest.mark.slow  # with the 16-run unpacked sweep it is compared to: 70 s
def test_local_pack_equals_unpacked_and_retries_only_the_killed_member(tmp_path,
                                                                      unpacked_sweep):
    """4 runs in 2 packs of 2 under `snakemake --cores 2 --retries 1`, saving after every
    batch; one member is SIGKILLed after its first in-segment save (frozen from its start,
    it trains in short steps until the save exists): its pack job fails once the other
    member finished, and the retry trains the killed member alone, from its own checkpoint,
    at the batch of that save. Final weights equal the unpacked sweep's."""
    config = sweep_config(tmp_path / "c.yaml", 4, 2, train="checkpoint_interval_s: 0.001")
    proc = start_snakemake(tmp_path, "--cores", "2", "--retries", "1", configfile=config)
    victim = "cpu_lr0p02"
    pid, saved = member_process(proc, victim, 1), None
    if pid:
        saved = train_until_saved([pid], tmp_path / f"results/runs/{victim}/work")
        os.kill(pid, signal.SIGKILL)
    output = proc.communicate(timeout=600)[0]
    assert saved, "the member's training process never appeared"
    assert proc.returncode == 0, output[-4000:]
    assert (saved["epoch"], saved["done"]) == (0, False) and 1 <= saved["step"] < 10, saved
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
    for run, state in final_states(tmp_path).items():
        assert_bit_identical(state["model"], unpacked_sweep[run]["model"])
        # each member's TensorBoard curve, the killed one's retry included, as it trained
        assert_epoch_scalars(tmp_path / f"results/tensorboard/{run}",
                             metrics_of(tmp_path / f"results/runs/{run}/segment-2"), 1000 // 100)


@pytest.mark.slow  # 4 packed runs and the 16-run unpacked sweep they are compared to
def test_a_member_stopped_early_gets_an_extra_segment_in_its_pack(tmp_path, unpacked_sweep):
    """In its last planned segment a pack member is stopped early (SIGUSR2 at an in-segment
    save inside epoch 2, frozen there: the stop a time limit gives): its segment is
    published unfinished, so the workflow gives it a third segment, in its pack's next job
    and alone in it; the other member is done after 2. Every run ends bit for bit as the
    same sweep unpacked."""
    from cifarflow.engine import checkpoint as ckpt

    config = sweep_config(tmp_path / "c.yaml", 4, 2, train="checkpoint_interval_s: 0.001")
    proc = start_snakemake(tmp_path, "--cores", "2", configfile=config)
    victim = "cpu_lr0p02"
    work = tmp_path / f"results/runs/{victim}/work"
    pid, saved = member_process(proc, victim, 2), None
    if pid:
        os.kill(pid, signal.SIGSTOP)
        deadline = time.time() + 300
        while time.time() < deadline:  # on in short steps to a save inside epoch 2
            manifest = ckpt.read_manifest(work) if (work / "checkpoint.json").exists() else {}
            if manifest.get("epoch") == 1 and manifest.get("step", 0) >= 1:
                saved = manifest
                break
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)
            os.kill(pid, signal.SIGSTOP)
        os.kill(pid, signal.SIGUSR2)
        os.kill(pid, signal.SIGCONT)
    output = proc.communicate(timeout=600)[0]
    assert saved, "the member's segment-2 training never appeared or never saved"
    assert proc.returncode == 0, output[-4000:]
    published = ckpt.read_manifest(tmp_path / f"results/runs/{victim}/segment-2")
    assert (published["epoch"], published["done"]) == (1, False), published
    assert saved["step"] <= published["step"] < 10
    logs = tmp_path / "results/logs/packs"
    third = (logs / "cpu-pack001/segment-3.log").read_text()
    assert victim in third and "cpu_lr0p01" not in third, third
    assert not (logs / "cpu-pack002/segment-3.log").exists()
    assert not (tmp_path / "results/runs/cpu_lr0p01/segment-3").exists()
    rows = summary_rows(tmp_path)
    assert rows[victim]["segments"] == "3" and rows["cpu_lr0p01"]["segments"] == "2"
    assert {r["status"] for r in rows.values()} == {"ok"}
    for run, state in final_states(tmp_path).items():
        assert_bit_identical(state["model"], unpacked_sweep[run]["model"])
