"""The engine through its real CLI: learning, determinism, exact segment resume,
time-budget and signal stops, corrupt checkpoints and config changes."""

import json
import signal
import subprocess
import time

import pytest

from conftest import (ENV, PY, assert_bit_identical, cli, metrics_of, same_metrics, spec,
                      state_of, train, train_until_saved)
from cifarflow.engine.checkpoints import files as ckpt

SPEC = dict(epochs=3, scheduler="cosine", momentum=0.9, weight_decay=5e-4)


@pytest.fixture(scope="module")
def reference(cifar_dir, tmp_path_factory):
    """Three epochs in one segment: what every split variant must reproduce."""
    out = tmp_path_factory.mktemp("ref") / "segment-1"
    train(cifar_dir, out, spec_kw=SPEC)
    return out


def test_training_learns(reference):
    history = metrics_of(reference)
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert history[-1]["train_loss"] < 0.8 * history[0]["train_loss"]
    assert history[-1]["test_acc"] > 0.3  # chance is 0.1
    for h in history:
        assert h["images_per_sec"] > 0 and h["wall_s"] > 0 and h["peak_mem_mb"] > 0
    # each epoch's training window (wall clock): in order, one after the other
    windows = [(h["started_at"], h["ended_at"]) for h in history]
    assert all(start <= end for start, end in windows), windows
    assert all(a[1] <= b[0] for a, b in zip(windows, windows[1:])), windows
    manifest = ckpt.read_manifest(reference)
    assert manifest["done"] and manifest["epoch"] == 3


def test_same_seed_same_metrics_and_weights(cifar_dir, reference, tmp_path):
    train(cifar_dir, tmp_path / "again", spec_kw=SPEC)
    assert same_metrics(metrics_of(reference), metrics_of(tmp_path / "again"))
    assert_bit_identical(state_of(reference)["model"], state_of(tmp_path / "again")["model"])


def test_other_seed_differs(cifar_dir, reference, tmp_path):
    train(cifar_dir, tmp_path / "s1", spec_kw={**SPEC, "seed": 1})
    assert not same_metrics(metrics_of(reference), metrics_of(tmp_path / "s1"))


@pytest.mark.slow  # three trainings: 60 s here
def test_bf16_autocast_learns_and_resumes_exactly(cifar_dir, reference, tmp_path):
    """train.amp bf16 on CPU: the forward passes run in bfloat16 (other weights than the
    float32 reference), the model learns, and two segments equal one bit for bit."""
    bf16 = {**SPEC, "amp": "bf16"}
    train(cifar_dir, tmp_path / "whole", spec_kw=bf16)
    history = metrics_of(tmp_path / "whole")
    assert history[-1]["train_loss"] < 0.8 * history[0]["train_loss"]
    assert history[-1]["test_acc"] > 0.3
    whole = state_of(tmp_path / "whole")["model"]
    assert any(not w.equal(r) for w, r in zip(whole.values(),
                                              state_of(reference)["model"].values()))
    train(cifar_dir, tmp_path / "segment-1", spec_kw=bf16, until_epoch=1)
    train(cifar_dir, tmp_path / "segment-2", spec_kw=bf16, resume=tmp_path / "segment-1")
    assert_bit_identical(whole, state_of(tmp_path / "segment-2")["model"])
    assert same_metrics(history, metrics_of(tmp_path / "segment-2"))


def test_three_segments_equal_one_bit_for_bit(cifar_dir, reference, tmp_path):
    prev = None
    for k, until in enumerate([1, 2, 3], start=1):
        out = tmp_path / f"segment-{k}"
        extra = {"resume": prev} if prev else {}
        train(cifar_dir, out, spec_kw=SPEC, until_epoch=until, **extra)
        assert ckpt.read_manifest(out)["done"] == (k == 3)
        prev = out
    assert_bit_identical(state_of(reference)["model"], state_of(prev)["model"])
    ref_opt, opt = state_of(reference)["optimizer"], state_of(prev)["optimizer"]
    for key in ref_opt["state"]:
        assert_bit_identical(ref_opt["state"][key], opt["state"][key])
    assert same_metrics(metrics_of(reference), metrics_of(prev))


def test_time_budget_stops_mid_epoch_and_resumes_exactly(cifar_dir, reference, tmp_path):
    first = tmp_path / "segment-1"
    # a budget already spent when training starts: the stop comes after the first batch,
    # however fast the machine
    out = train(cifar_dir, first, spec_kw={**SPEC, "budget_s": 0.01, "margin_s": 0})
    m = ckpt.read_manifest(first)
    assert "stopping at epoch 1 batch 1: time budget" in out.stdout
    assert not m["done"] and (m["epoch"], m["step"]) == (0, 1)
    train(cifar_dir, tmp_path / "segment-2", spec_kw=SPEC, resume=first)
    assert_bit_identical(state_of(reference)["model"], state_of(tmp_path / "segment-2")["model"])
    assert same_metrics(metrics_of(reference), metrics_of(tmp_path / "segment-2"))


def test_the_rule_runtime_is_the_budget_when_the_spec_sets_none(cifar_dir, tmp_path):
    """--budget-min (the rule's runtime) budgets a spec with budget_s 0: already spent at
    the start (0.0002 min, margin 0), the segment stops after its first batch."""
    out = train(cifar_dir, tmp_path / "segment-1", spec_kw={**SPEC, "margin_s": 0},
                budget_min=0.0002)
    assert "stopping at epoch 1 batch 1: time budget" in out.stdout
    m = ckpt.read_manifest(tmp_path / "segment-1")
    assert (m["epoch"], m["step"], m["done"]) == (0, 1, False)
    assert m["segment_runs"][-1]["requested_runtime_min"] == 0.0002


def test_sigusr2_checkpoints_at_next_batch_and_exits_cleanly(cifar_dir, reference, tmp_path):
    """SIGUSR2 inside the first epoch (the process frozen at its first in-segment save, so
    on any machine): it checkpoints within the two batches after that save, exits 0, and the
    next segment ends bit-identical to an uninterrupted run."""
    first, work = tmp_path / "segment-1", tmp_path / "work"
    args = [PY, "-m", "cifarflow", "train", "--spec", str(spec(**{**SPEC, "batch_size": 20,
            "checkpoint_interval_s": 0.001})), "--data", str(cifar_dir), "--out", str(first),
            "--work", str(work), "--threads", "2"]
    proc = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, text=True)
    saved = train_until_saved([proc.pid], work)
    proc.send_signal(signal.SIGUSR2)
    proc.send_signal(signal.SIGCONT)
    rest = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0
    assert "signal SIGUSR2" in rest
    m = ckpt.read_manifest(first)
    assert not m["done"] and m["epoch"] == saved["epoch"] == 0
    # frozen somewhere in the batch after that save, the signal is raised at that batch's
    # end and acted on one batch later (the flags of a batch are read while the next one
    # trains: StopController): at most 2 batches after the save, inside epoch 1
    assert saved["step"] <= m["step"] <= saved["step"] + 2
    second = tmp_path / "segment-2"
    train(cifar_dir, second, spec_kw={**SPEC, "batch_size": 20}, resume=first)
    uninterrupted = tmp_path / "whole"
    train(cifar_dir, uninterrupted, spec_kw={**SPEC, "batch_size": 20})
    assert_bit_identical(state_of(uninterrupted)["model"], state_of(second)["model"])


def test_truncated_checkpoint_is_refused_with_its_name(cifar_dir, reference, tmp_path):
    import shutil

    broken = tmp_path / "segment-1"
    shutil.copytree(reference, broken)
    payload = broken / "state.pt"
    payload.write_bytes(payload.read_bytes()[:1000])
    with pytest.raises(ckpt.CheckpointError, match="truncated checkpoint: .*state.pt"):
        ckpt.read_manifest(broken)
    out = cli("train", "--spec", spec(**SPEC), "--data", cifar_dir, "--out",
              tmp_path / "segment-2", "--resume", broken, check=False)
    assert out.returncode == 2
    assert "truncated checkpoint" in out.stderr and "state.pt" in out.stderr
    (broken / "checkpoint.json").unlink()
    with pytest.raises(ckpt.CheckpointError, match="incomplete checkpoint"):
        ckpt.read_manifest(broken)


def test_corrupt_bytes_are_detected(reference, tmp_path):
    import shutil

    broken = tmp_path / "c"
    shutil.copytree(reference, broken)
    raw = bytearray((broken / "state.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (broken / "state.pt").write_bytes(bytes(raw))
    with pytest.raises(ckpt.CheckpointError, match="sha256"):
        ckpt.read_manifest(broken)


def test_changed_training_config_is_refused(cifar_dir, reference, tmp_path):
    out = cli("train", "--spec", spec(**{**SPEC, "lr": 0.1}), "--data", cifar_dir,
              "--out", tmp_path / "next", "--resume", reference, check=False)
    assert out.returncode == 2
    assert "refusing to resume" in out.stderr and "lr: 0.05 -> 0.1" in out.stderr
    # performance knobs may change between segments
    train(cifar_dir, tmp_path / "ok", spec_kw={**SPEC, "channels_last": False}, resume=reference)


CRASHING_WRITER = """
import os, signal, sys
from pathlib import Path
from cifarflow.engine.checkpoints import files as ckpt

class Solo:
    is_main, device = True, "cpu"

    def barrier(self):
        pass

def crash(*args, **kw):
    os.kill(os.getpid(), signal.SIGKILL)

target, point, meta = Path(sys.argv[1]), sys.argv[2], eval(sys.argv[3])
saver = ckpt.FileCheckpointer(Solo())
saver.save(target, {"x": 1}, {**meta, "epoch": 1}, {"m.txt": "one"})
if point == "after the payload":
    ckpt._finish = crash
elif point == "after the manifest":
    ckpt.publish = crash
elif point == "between the renames":
    rename = os.replace

    def staging_in_crashes(src, dst):  # the old one is moved aside, the new not yet in
        crash() if Path(dst) == target else rename(src, dst)
    os.replace = staging_in_crashes
saver.save(target, {"x": 2}, {**meta, "epoch": 2}, {"m.txt": "two"})
"""


@pytest.mark.parametrize("point", ["after the payload", "after the manifest",
                                   "between the renames", "nowhere"])
def test_a_writer_killed_while_it_publishes_leaves_the_old_checkpoint_whole(tmp_path, point):
    """A process saves a checkpoint, then is SIGKILLed while it saves the next one over it
    (at each step of the publish); the next segment's resume decision still finds the old
    checkpoint, whole (or the new one when nothing crashed), and no half of either."""
    import torch

    from cifarflow.config import TrainConfig
    from cifarflow.engine.checkpoints.resume import Choice, decide

    cfg = TrainConfig.read(spec())
    meta = {"config_hash": cfg.shaping_hash(), "config": cfg.to_dict(), "step": 0}
    target = tmp_path / "work"
    out = subprocess.run([PY, "-c", CRASHING_WRITER, target, point, repr(meta)], env=ENV,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == (0 if point == "nowhere" else -signal.SIGKILL), out.stderr
    epoch, text = (2, "two") if point == "nowhere" else (1, "one")
    decision = decide(cfg, 3, tmp_path / "segment-1", None, target)
    assert (decision.choice, decision.path, decision.notes) == (Choice.WORK, target, ())
    assert ckpt.read_manifest(target)["epoch"] == epoch  # every file's sha256 checked
    assert (target / "m.txt").read_text() == text
    assert torch.load(target / "state.pt", weights_only=False) == {"x": epoch}


def test_metrics_are_covered_by_the_manifest(reference, tmp_path):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(reference, copy)
    assert "metrics.jsonl" in ckpt.read_manifest(copy)["files"]
    with open(copy / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 4}\n')
    with pytest.raises(ckpt.CheckpointError, match="metrics.jsonl"):
        ckpt.read_manifest(copy)


def test_in_segment_saves_every_batch_change_nothing(cifar_dir, reference, tmp_path):
    """checkpoint_interval_s far below a step's time: a save at every batch boundary."""
    out = train(cifar_dir, tmp_path / "s", spec_kw={**SPEC, "checkpoint_interval_s": 1e-6},
                work=tmp_path / "work")
    work = ckpt.read_manifest(tmp_path / "work")
    assert (work["epoch"], work["step"]) == (2, 19)  # the last boundary before the end
    assert_bit_identical(state_of(reference)["model"], state_of(tmp_path / "s")["model"])
    assert same_metrics(metrics_of(reference), metrics_of(tmp_path / "s"))


def test_changed_synthetic_data_is_refused(cifar_dir, reference, tmp_path):
    other = spec(**SPEC)
    text = json.loads(other.read_text())
    assert text["data_id"].startswith("synthetic-")
    from cifarflow.config import data_identity, with_defaults

    changed = with_defaults({"data": {"synthetic": {"train_size": 2000, "test_size": 400,
                                                    "noise": 0.5}}})["data"]
    text["data_id"] = data_identity(changed)
    other.write_text(json.dumps(text))
    out = cli("train", "--spec", other, "--data", cifar_dir, "--out", tmp_path / "n",
              "--resume", reference, check=False)
    assert out.returncode == 2 and "data_id" in out.stderr and "refusing to resume" in out.stderr


def test_gpu_sampler_averages_what_it_read_during_the_epoch():
    """Recorded NVML readings (utilisation %, memory MB): each take() covers the samples
    since the previous one; the background thread keeps sampling until stopped."""
    from cifarflow.engine.gpu_monitor import GpuSampler

    readings = iter([(90.0, 1000.0), (30.0, 1500.0), (60.0, 1200.0), (20.0, 800.0),
                     (10.0, 700.0)])
    sampler = GpuSampler(lambda: next(readings))
    for _ in range(3):
        sampler.sample()
    # the three read while the epoch trained, and one that take() reads at its end
    assert sampler.take() == {"gpu_util_pct": 50.0, "gpu_mem_mb": 1500.0, "gpu_samples": 4}
    assert sampler.take() == {"gpu_util_pct": 10.0, "gpu_mem_mb": 700.0, "gpu_samples": 1}
    assert sampler.take()["gpu_util_pct"] is None  # nothing could be read: unknown, not 0

    ticks = []
    live = GpuSampler(lambda: ticks.append(1) or (50.0, 100.0), interval_s=0.01).start()
    deadline = time.time() + 60
    while len(ticks) < 3 and time.time() < deadline:
        time.sleep(0.01)
    live.stop()
    taken = live.take()
    assert taken["gpu_samples"] >= 3 and taken["gpu_util_pct"] == 50.0
    assert len(ticks) == taken["gpu_samples"]  # stopped: no reading after stop()


def test_advice_flags_an_under_used_gpu():
    import pandas as pd

    from cifarflow.results.advice import advice
    from cifarflow.results.table import COLUMNS

    rows = [{c: None for c in COLUMNS} | {"run": run, "strategy": s, "device": d, "status": "ok",
                                          "images_per_sec": ips, "images_per_sec_per_core": ips,
                                          "cpus_per_task": 1, "gpu_util_pct": util}
            for run, s, d, ips, util in [("cpu", "cpu", "cpu", 900.0, None),
                                         ("gpu", "gpu", "cuda", 5000.0, 23.0),
                                         ("ddp", "ddp", "cuda", 9000.0, 91.0)]]
    tips = advice(pd.DataFrame(rows, columns=COLUMNS))
    assert "gpu uses the GPU only 23% of the time: share it with MPS replicas or use a CPU job" \
        in tips
    assert not any(t.startswith("ddp uses the GPU") for t in tips)


def test_a_segment_records_what_it_used(cifar_dir, tmp_path):
    """CPU time, peak memory and wall time of the try, checked against what this test
    measures of the same process from outside (its own rusage, from wait4)."""
    import os

    out = tmp_path / "segment-1"
    argv = [PY, "-m", "cifarflow", "train", "--spec", str(spec(**dict(SPEC, epochs=1))),
            "--data", str(cifar_dir), "--out", str(out), "--threads", "1"]
    t0 = time.time()
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - t0
    assert status == 0
    used = ckpt.read_manifest(out)["segment_runs"][-1]
    cpu = usage.ru_utime + usage.ru_stime
    # the same interpreter importing what the segment imports, and nothing else: the
    # recorded time holds that and the training (not a ratio of the total: its share of the
    # teardown after the record is not the test's business), and never more than the total
    imports = subprocess.Popen([PY, "-c", "import torch, cifarflow.engine, cifarflow.cli"],
                               env=ENV)
    _, imported_ok, imported = os.wait4(imports.pid, 0)
    assert imported_ok == 0
    assert imported.ru_utime + imported.ru_stime < used["cpu_s"] <= cpu
    assert 0 < used["wall_s"] <= wall and used["cpus"] == 1
    assert used["cpu_efficiency"] == pytest.approx(used["cpu_s"] / used["wall_s"])
    assert used["peak_rss_mb"] == pytest.approx(usage.ru_maxrss / 1024, rel=0.05)
    assert used["ended"] == "completed" and used["queue_wait_s"] is None
    assert list(used["peak_rss_mb_per_node"].values()) == [used["peak_rss_mb"]]


@pytest.mark.parametrize("amp", ["bf16", pytest.param("auto", marks=[pytest.mark.slow,
                                                                       pytest.mark.variant])])
def test_bf16_on_cpu_two_segments_equal_one_bit_for_bit(cifar_dir, tmp_path, amp):
    """amp bf16 (autocast on the CPU) resumes like any other run; auto records what it chose:
    bf16 where this CPU computes it natively (AMX, AVX512-BF16), none elsewhere."""
    from cifarflow.engine.hardware import cpu_features

    kw = {**SPEC, "epochs": 2, "amp": amp}
    train(cifar_dir, tmp_path / "one", spec_kw=kw)
    train(cifar_dir, tmp_path / "segment-1", spec_kw=kw, until_epoch=1)
    out = train(cifar_dir, tmp_path / "segment-2", spec_kw=kw, resume=tmp_path / "segment-1")
    assert "resumed from" in out.stdout
    assert_bit_identical(state_of(tmp_path / "one")["model"], state_of(tmp_path / "segment-2")["model"])
    history = metrics_of(tmp_path / "segment-2")
    assert same_metrics(metrics_of(tmp_path / "one"), history)
    chosen = "bf16" if amp == "bf16" or cpu_features()["bf16_native"] else "none"
    assert [h["amp"] for h in history] == [chosen, chosen]
    # autocast really ran where bf16 was chosen (the label alone comes from the config): the
    # same run in float32 ends elsewhere; where auto chose none, it ends the same
    train(cifar_dir, tmp_path / "float32", spec_kw={**kw, "amp": "none"})
    float32 = state_of(tmp_path / "float32")["model"]
    import torch

    differs = any(not torch.equal(float32[k], v)
                  for k, v in state_of(tmp_path / "one")["model"].items())
    assert differs == (chosen == "bf16")
