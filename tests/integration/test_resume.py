"""Nothing silent: which checkpoint a segment resumes from, per checkpointer. A damaged
in-segment checkpoint is an explicit, logged fallback (recorded for summary.csv); a
damaged or incompatible segment checkpoint, or a work dir of another config, is one clear
error naming the file and what to do."""

import shutil

import pytest

from conftest import (PY, assert_bit_identical, cli, metrics_of, same_metrics, spec, state_of, train,
                      weights_digest)
from cifarflow.engine.checkpoints import files as ckpt
from cifarflow.results.table import summarize_run

SPEC = dict(epochs=3, scheduler="cosine", weight_decay=5e-4)
FSDP = dict(SPEC, strategy="fsdp", world_size=2, device="cpu")


@pytest.fixture(scope="module")
def chain(cifar_dir, tmp_path_factory):
    """segment-1 (epoch 1), a work dir saved inside epoch 2, and the uninterrupted run."""
    root = tmp_path_factory.mktemp("chain")
    train(cifar_dir, root / "segment-1", spec_kw=SPEC, until_epoch=1)
    train(cifar_dir, root / "partial", spec_kw={**SPEC, "checkpoint_interval_s": 1e-6},
          resume=root / "segment-1", until_epoch=2, work=root / "work")
    train(cifar_dir, root / "whole", spec_kw=SPEC)
    return root


def segment_2(cifar_dir, chain, tmp_path, work, **kw):
    return train(cifar_dir, tmp_path / "segment-2", spec_kw=kw.pop("spec_kw", SPEC),
                 resume=chain / "segment-1", work=work, **kw)


def test_furthest_checkpoint_wins_and_resumes_exactly(cifar_dir, chain, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(chain / "work", work)
    out = segment_2(cifar_dir, chain, tmp_path, work)
    assert f"resumed from {work} at epoch 2" in out.stdout  # ahead of segment-1
    assert_bit_identical(state_of(chain / "whole")["model"], state_of(tmp_path / "segment-2")["model"])
    assert weights_digest(chain / "whole") == weights_digest(tmp_path / "segment-2")
    assert same_metrics(metrics_of(chain / "whole"), metrics_of(tmp_path / "segment-2"))


def test_damaged_work_dir_is_a_logged_fallback_shown_in_the_summary(cifar_dir, chain, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(chain / "work", work)
    raw = bytearray((work / "state.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (work / "state.pt").write_bytes(bytes(raw))
    out = segment_2(cifar_dir, chain, tmp_path, work)
    assert "WARNING: in-segment checkpoint unusable (corrupt checkpoint:" in out.stdout
    assert f"fell back to {chain / 'segment-1'}" in out.stdout
    assert f"resumed from {chain / 'segment-1'} at epoch 2, batch 0" in out.stdout
    events = ckpt.read_manifest(tmp_path / "segment-2")["events"]
    assert len(events) == 1 and "state.pt fails its sha256 check" in events[0]
    assert_bit_identical(state_of(chain / "whole")["model"], state_of(tmp_path / "segment-2")["model"])
    assert weights_digest(chain / "whole") == weights_digest(tmp_path / "segment-2")
    row = summarize_run("cpu", {"strategy": "cpu", "spec": {"model": "lenet", "batch_size": 100, "device": "cpu",
                                                            "epochs": 3}, "resources": {},
                                "metrics": str(tmp_path / "segment-2" / "metrics.jsonl")})
    assert "fell back to" in row["fallbacks"] and row["status"] == "ok"
    assert row["weights_sha256"] == weights_digest(chain / "whole")  # summary.csv's column


def test_work_dir_of_another_config_is_refused(cifar_dir, chain, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(chain / "work", work)
    out = cli("train", "--spec", spec(**{**SPEC, "lr": 0.1}), "--data", cifar_dir, "--out",
              tmp_path / "segment-1", "--work", work, check=False)
    assert out.returncode == 2
    assert f"refusing to resume from {work}" in out.stderr and "lr: 0.05 -> 0.1" in out.stderr
    assert f"delete {work}" in out.stderr
    assert not (tmp_path / "segment-1").exists()


def test_segment_of_another_config_is_refused(cifar_dir, chain, tmp_path):
    """The previous segment's checkpoint written by another training config: one error
    naming it, the changed key and the fix; nothing trains."""
    out = cli("train", "--spec", spec(**{**SPEC, "lr": 0.1}), "--data", cifar_dir, "--out",
              tmp_path / "segment-2", "--resume", chain / "segment-1", check=False)
    assert out.returncode == 2
    assert (f"refusing to resume from {chain / 'segment-1'}: the training config changed "
            f"(lr: 0.05 -> 0.1). Restore the config, or delete {tmp_path} to train this run "
            "afresh") in out.stderr
    assert not (tmp_path / "segment-2").exists()


def test_checkpoint_past_the_target_is_published_not_retrained(cifar_dir, chain, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(chain / "work", work)  # inside epoch 2; this segment's target is epoch 1
    out = train(cifar_dir, tmp_path / "segment-1", spec_kw=SPEC, until_epoch=1, work=work)
    assert "past this segment's target epoch 1" in out.stdout
    m, w = ckpt.read_manifest(tmp_path / "segment-1"), ckpt.read_manifest(work)
    assert (m["epoch"], m["step"]) == (w["epoch"], w["step"]) and m["segment_reached_target"]


def test_missing_previous_segment_is_an_error(cifar_dir, tmp_path):
    out = cli("train", "--spec", spec(**SPEC), "--data", cifar_dir, "--out", tmp_path / "s2",
              "--resume", tmp_path / "segment-1", check=False)
    assert out.returncode == 2 and f"{tmp_path / 'segment-1'} is missing" in out.stderr


# ---- the sharded checkpointer (FSDP, 2 ranks) -------------------------------------------

@pytest.fixture(scope="module")
def fsdp_chain(cifar_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    kw = dict(threads=1, nproc=2, spec_kw=FSDP)
    train(cifar_dir, root / "segment-1", until_epoch=1, **kw)
    train(cifar_dir, root / "partial", resume=root / "segment-1", until_epoch=2, work=root / "work",
          threads=1, nproc=2, spec_kw={**FSDP, "checkpoint_interval_s": 1e-6})
    return root


@pytest.mark.slow
@pytest.mark.variant
def test_damaged_dcp_shard_in_work_dir_falls_back_with_a_warning(cifar_dir, fsdp_chain, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(fsdp_chain / "work", work)
    shard = sorted((work / "shards").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    out = train(cifar_dir, tmp_path / "segment-2", resume=fsdp_chain / "segment-1", work=work,
                threads=1, nproc=2, spec_kw=FSDP)
    assert "WARNING: in-segment checkpoint unusable (truncated checkpoint:" in out.stdout
    assert shard.name in out.stdout
    assert ckpt.read_manifest(tmp_path / "segment-2")["done"]


@pytest.mark.slow
@pytest.mark.variant
def test_damaged_dcp_metadata_of_a_segment_is_an_error(cifar_dir, fsdp_chain, tmp_path):
    broken = tmp_path / "segment-1"
    shutil.copytree(fsdp_chain / "segment-1", broken)
    meta = broken / "shards" / ".metadata"
    raw = bytearray(meta.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    meta.write_bytes(bytes(raw))
    out = cli("launch", "--nproc", 2, "--", PY, "-m", "cifarflow", "train", "--spec",
              spec(**FSDP), "--data", cifar_dir, "--out", tmp_path / "segment-2", "--resume",
              broken, "--threads", 1, check=False)
    assert out.returncode != 0
    assert "corrupt checkpoint" in out.stderr and ".metadata fails its sha256 check" in out.stderr
