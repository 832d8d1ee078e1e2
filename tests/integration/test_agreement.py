"""Ranks decide together: with 2 ranks of ddp, fsdp and lightning, a save at every batch
boundary, a time-budget stop and a SIGUSR2 sent to one rank only are agreed by both ranks
at the same batch, and the run resumes bit-exactly. Inside an epoch the ranks act on the
flags raised a batch before (StopController), so no batch waits for the collective."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import (ENV, PY, assert_bit_identical, metrics_of, process_tree, same_metrics, spec,
                      train, train_until_saved, training_spec)
from cifarflow.engine.checkpoints import files as ckpt

# one StopController for all: test-fast proves the agreement with ddp, make test with each
STRATEGIES = ["ddp", *(pytest.param(s, marks=[pytest.mark.slow, pytest.mark.variant])
                       for s in ("fsdp", "lightning"))]
SPEC = dict(epochs=2, batch_size=20, lr=0.05, world_size=2, device="cpu")  # 50 batches/epoch


def weights(directory: Path) -> dict:
    if (directory / "state.pt").is_file():
        return torch.load(directory / "state.pt", weights_only=False)["model"]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = directory.with_name(directory.name + "-full.pt")
    dcp_to_torch_save(directory / "shards", target)
    return torch.load(target, weights_only=False)["model"]


def run2(cifar_dir, out, strategy, **kw):
    return train(cifar_dir, out, threads=1, nproc=2, spec_kw={**SPEC, "strategy": strategy,
                                                               **kw.pop("spec_kw", {})}, **kw)


def stops(stdout: str) -> dict:
    """rank -> (epoch, batch, reason) from each rank's own stop line."""
    return {int(r): (int(e), int(b), why) for r, e, b, why in
            re.findall(r"\[rank (\d)\] stopping at epoch (\d+) batch (\d+): (.*)", stdout)}


@pytest.fixture(scope="module", params=STRATEGIES)
def reference(request, cifar_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "whole"
    run2(cifar_dir, out, request.param)
    return request.param, out


def test_a_save_at_every_batch_boundary_finishes_unchanged(cifar_dir, reference, tmp_path):
    strategy, whole = reference
    out = run2(cifar_dir, tmp_path / "s", strategy, spec_kw={"checkpoint_interval_s": 1e-6},
               work=tmp_path / "work")
    assert "Timed out" not in out.stdout + out.stderr
    work = ckpt.read_manifest(tmp_path / "work")
    assert (work["epoch"], work["step"]) == (1, 49)  # saved up to the last boundary
    assert_bit_identical(weights(whole), weights(tmp_path / "s"))
    assert same_metrics(metrics_of(whole), metrics_of(tmp_path / "s"))


def test_budget_stop_is_agreed_and_resumes_exactly(cifar_dir, reference, tmp_path):
    strategy, whole = reference
    out = run2(cifar_dir, tmp_path / "s1", strategy, spec_kw={"budget_s": 0.01, "margin_s": 0})
    # the flags raised at batch 1 are all-reduced while batch 2 trains, and acted on after it
    assert stops(out.stdout) == {0: (1, 2, "time budget"), 1: (1, 2, "time budget")}
    run2(cifar_dir, tmp_path / "s2", strategy, resume=tmp_path / "s1")
    assert_bit_identical(weights(whole), weights(tmp_path / "s2"))
    assert same_metrics(metrics_of(whole), metrics_of(tmp_path / "s2"))


def rank_pid(root: int, rank: int) -> int:
    """The training process of a rank under root (torchrun sets RANK, Lightning LOCAL_RANK)."""
    children = {int(p): [] for p in os.listdir("/proc") if p.isdigit()}
    for pid in list(children):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
        children.setdefault(ppid, []).append(pid)
    todo, found = [root], []
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            env = dict(v.split("=", 1) for v in
                       Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v)
        except OSError:
            continue
        if env.get("RANK", env.get("LOCAL_RANK")) == str(rank) and "cifarflow" in \
                Path(f"/proc/{pid}/cmdline").read_text():
            found.append(pid)
    assert len(found) == 1, f"rank {rank} processes: {found}"
    return found[0]


def test_sigusr2_to_one_rank_stops_both_at_the_same_batch(cifar_dir, reference, tmp_path):
    strategy, whole = reference
    launch = ["launch", "--nproc", "2"] + (["--self-spawning"] if strategy == "lightning" else [])
    cmd = [PY, "-m", "cifarflow", *launch, "--", PY, "-m", "cifarflow", "train", "--spec",
           str(spec(strategy=strategy, **SPEC, log_interval_s=0)), "--data", str(cifar_dir),
           "--out", str(tmp_path / "s1"), "--threads", "1"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    seen = []
    for line in proc.stdout:  # both ranks are inside epoch 1: rank 0 logged a batch
        seen.append(line)
        if re.match(r"\s+epoch 1/2 batch \d+/50", line):
            break
    os.killpg(proc.pid, signal.SIGSTOP)  # freeze both ranks while the signal is aimed
    try:
        os.kill(rank_pid(proc.pid, 1), signal.SIGUSR2)
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
    stdout = "".join(seen) + proc.stdout.read()
    assert proc.wait(timeout=300) == 0, stdout[-3000:]
    found = stops(stdout)
    assert set(found) == {0, 1}, stdout[-3000:]
    (e0, b0, why0), (e1, b1, why1) = found[0], found[1]
    assert (e0, b0) == (e1, b1) and (e0, b0) < (2, 50)
    assert why1 == "signal SIGUSR2" and why0 == "signal on rank 1"
    m = ckpt.read_manifest(tmp_path / "s1")
    assert (m["epoch"] + 1, m["step"]) == (e0, b0) and not m["done"]
    run2(cifar_dir, tmp_path / "s2", strategy, resume=tmp_path / "s1")
    assert_bit_identical(weights(whole), weights(tmp_path / "s2"))
    assert same_metrics(metrics_of(whole), metrics_of(tmp_path / "s2"))


@pytest.mark.slow  # about 20 s; ddp proves the in-segment resume in test-fast
@pytest.mark.variant
def test_killed_lightning_segment_resumes_from_its_in_segment_checkpoint(cifar_dir, tmp_path):
    whole = tmp_path / "whole"
    run2(cifar_dir, whole, "lightning")
    cmd = [PY, "-m", "cifarflow", "launch", "--nproc", "2", "--self-spawning", "--", PY, "-m",
           "cifarflow", "train", "--spec", str(spec(strategy="lightning", **SPEC,
                                                    checkpoint_interval_s=1e-6)),
           "--data", str(cifar_dir), "--out", str(tmp_path / "s1"), "--work",
           str(tmp_path / "work"), "--threads", "1"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:  # both ranks, frozen at a known in-segment save, so on any machine
        deadline, ranks = time.time() + 300, []
        while len(ranks) < 2 and proc.poll() is None and time.time() < deadline:
            ranks = [pid for pid in [proc.pid, *process_tree(proc.pid)] if training_spec(pid)]
            time.sleep(0.01)
        assert len(ranks) == 2, ranks
        saved = train_until_saved(ranks, tmp_path / "work")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the node dies: both ranks at once
        proc.wait()
    assert not (tmp_path / "s1").exists(), "the segment finished before it could be killed"
    out = run2(cifar_dir, tmp_path / "s1", "lightning", work=tmp_path / "work")
    # exactly the save both ranks were frozen at
    assert (f"resumed from {tmp_path / 'work'} at epoch {saved['epoch'] + 1}, "
            f"batch {saved['step']}") in out.stdout
    assert_bit_identical(weights(whole), weights(tmp_path / "s1"))
    assert same_metrics(metrics_of(whole), metrics_of(tmp_path / "s1"))


def test_a_checkpoint_past_the_target_is_published_not_retrained(cifar_dir, reference, tmp_path):
    strategy, whole = reference  # finished: epoch 2; this segment's target is epoch 1
    out = run2(cifar_dir, tmp_path / "s", strategy, resume=whole, until_epoch=1)
    assert "past this segment's target epoch 1" in out.stdout
    m = ckpt.read_manifest(tmp_path / "s")
    assert (m["epoch"], m["step"]) == (2, 0) and m["done"]
    assert_bit_identical(weights(whole), weights(tmp_path / "s"))
