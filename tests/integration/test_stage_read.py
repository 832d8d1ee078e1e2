"""Staged data is what the ranks train on (data.stage): the node-local copy in $SLURM_TMPDIR
is read by every rank, not the shared original. Proven by a staged copy that holds other
images than the original (same files, same sizes, so the reuse check passes): two ddp
ranks that stage train exactly as on those other images, read from where they lie."""

import pytest

from conftest import ENV, PY, SYNTHETIC, assert_bit_identical, cli, spec, state_of
from cifarflow import data
from cifarflow.engine.stage import stage_split

SPEC = dict(strategy="ddp", world_size=2, epochs=1, batch_size=100, lr=0.05)


def ddp(batches, out, env=ENV, stage="none"):
    return cli("launch", "--nproc", 2, "--", PY, "-m", "cifarflow", "train", "--spec",
               spec(**SPEC), "--data", batches, "--out", out, "--threads", 1,
               "--stage-data", stage, env=env)


@pytest.mark.slow  # three 2-rank runs: about 10 s; test_stage proves what staging copies
@pytest.mark.variant
def test_the_ranks_read_the_staged_copy_not_the_original(cifar_dir, tmp_path):
    archive = data.prepare_archive("synthetic", tmp_path / "other",
                                   synthetic={**SYNTHETIC, "seed": 99})
    other = data.extract_archive(archive, tmp_path / "other")
    node = tmp_path / "node"
    staged = stage_split(cifar_dir, "auto", environ={"SLURM_TMPDIR": str(node)},
                         say=lambda line: None)
    for name in data.TRAIN_FILES + [data.TEST_FILE]:
        assert (other / name).read_bytes() != (cifar_dir / name).read_bytes()
        assert (other / name).stat().st_size == (staged / name).stat().st_size
        (staged / name).write_bytes((other / name).read_bytes())

    out = ddp(cifar_dir, tmp_path / "staged", {**ENV, "SLURM_TMPDIR": str(node)}, "auto")
    text = out.stdout + out.stderr
    assert text.count(f"reading the copy staged on this node, {staged}") == 2, text[-3000:]
    ddp(other, tmp_path / "other-data")  # the staged copy's images, read in place
    assert_bit_identical(state_of(tmp_path / "staged")["model"],
                         state_of(tmp_path / "other-data")["model"])
