"""data.stage: the split copied once per node into node-local storage, verified, and
never reused without a check."""

import subprocess
import sys

import pytest

from conftest import ENV
from cifarflow.data import DatasetError
from cifarflow.engine.stage import STAGED, stage_split


def test_the_first_process_copies_and_verifies_the_next_checks_and_reuses(cifar_dir, tmp_path):
    said = []
    env = {"SLURM_TMPDIR": str(tmp_path / "node"), "SLURM_JOB_ID": "7"}
    local = stage_split(cifar_dir, "auto", environ=env, say=said.append)
    assert local == tmp_path / "node/cifarflow-data/cifar-10-batches-py"
    # the split's 7 files, its manifest, and the mark of a verified copy
    assert sorted(p.name for p in local.iterdir()) == sorted(
        [p.name for p in cifar_dir.iterdir()] + [STAGED])
    for name in ("data_batch_1", "test_batch", "batches.meta"):
        assert (local / name).read_bytes() == (cifar_dir / name).read_bytes()
    assert "staged 7 files" in said[0] and "md5 verified" in said[0]
    assert stage_split(cifar_dir, "slurm_tmpdir", environ=env, say=said.append) == local
    assert "reading the copy staged on this node" in said[1]
    # a damaged copy is not trusted: it is staged again
    (local / "data_batch_2").write_bytes(b"short")
    stage_split(cifar_dir, "auto", environ=env, say=said.append)
    assert "staged 7 files" in said[2]
    assert (local / "data_batch_2").read_bytes() == (cifar_dir / "data_batch_2").read_bytes()


def test_a_copy_of_another_split_is_replaced(cifar_dir, tmp_path):
    env = {"SLURM_TMPDIR": str(tmp_path)}
    local = stage_split(cifar_dir, "auto", environ=env, say=lambda m: None)
    (local / STAGED).write_text((local / STAGED).read_text().replace('"split": "', '"split": "0'))
    said = []
    stage_split(cifar_dir, "auto", environ=env, say=said.append)
    assert "staged 7 files" in said[0]


def test_where_nothing_is_staged(cifar_dir):
    said = []
    assert stage_split(cifar_dir, "none", environ={"SLURM_TMPDIR": "/x"}) == cifar_dir
    assert stage_split(cifar_dir, "auto", environ={}) == cifar_dir
    assert stage_split(cifar_dir, "slurm_tmpdir", environ={}, say=said.append) == cifar_dir
    assert said == [f"[data] data.stage slurm_tmpdir outside a Slurm job: reading {cifar_dir} in place"]
    with pytest.raises(DatasetError, match="this Slurm job has no SLURM_TMPDIR"):
        stage_split(cifar_dir, "slurm_tmpdir", environ={"SLURM_JOB_ID": "7"})


def test_processes_of_one_node_stage_once(cifar_dir, tmp_path):
    code = ("import sys; from pathlib import Path; from cifarflow.engine.stage import stage_split; "
            f"stage_split(Path({str(cifar_dir)!r}), 'slurm_tmpdir')")
    env = {**ENV, "SLURM_TMPDIR": str(tmp_path), "SLURM_JOB_ID": "7"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    lines = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum("staged 7 files" in out for out in lines) == 1
    assert sum("reading the copy staged on this node" in out for out in lines) == 3
