import pickle
import pickletools

import numpy as np
import pytest

from conftest import served_tarball
from cifarflow import data
from cifarflow.files import file_digest
from cifarflow.engine.loaders import Split, TensorBatches, TorchvisionBatches, shard, epoch_order


def test_synthetic_archive_has_the_real_layout(cifar_dir):
    names = sorted(p.name for p in cifar_dir.iterdir())
    assert names == sorted(data.TRAIN_FILES + [data.TEST_FILE, data.META_FILE, data.MANIFEST])
    x, y = data.load_split(cifar_dir, train=True)
    assert x.shape == (2000, 3, 32, 32) and x.dtype == np.uint8
    assert y.shape == (2000,) and set(np.unique(y)) == set(range(10))


def test_batches_are_python2_pickles_with_bytes_keys(cifar_dir):
    raw = (cifar_dir / "data_batch_1").read_bytes()
    ops = {op.name for op, _, _ in pickletools.genops(raw)}
    assert "SHORT_BINSTRING" in ops or "BINSTRING" in ops  # Python 2 str opcodes
    assert "SHORT_BINUNICODE" not in ops and "BINUNICODE" not in ops
    with pytest.raises(UnicodeDecodeError):  # what a naive py3 load of real CIFAR does
        pickle.loads(raw)
    loaded = pickle.loads(raw, encoding="bytes")
    assert b"data" in loaded and loaded[b"data"].shape[1] == 3072


def test_loader_accepts_str_and_bytes_keys(tmp_path):
    imgs = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    for key_type in (str, bytes):
        k = (lambda s: s.encode()) if key_type is bytes else (lambda s: s)
        path = tmp_path / f"batch_{key_type.__name__}"
        path.write_bytes(pickle.dumps({k("data"): imgs, k("labels"): [3, 7]}, protocol=2))
        x, y = data.read_batch(path)
        assert x.shape == (2, 3, 32, 32) and list(y) == [3, 7]
        assert x[1, 0, 0, 0] == imgs[1, 0]


def test_wrong_md5_is_a_clear_error(tmp_path):
    archive = data.prepare_archive("synthetic", tmp_path, synthetic={"train_size": 50, "test_size": 10})
    with pytest.raises(data.DatasetError, match="md5 mismatch .* set data.md5 to"):
        data.verify_archive(archive, data.CIFAR_MD5)


def test_truncated_archive_is_a_clear_error(tmp_path):
    archive = data.prepare_archive("synthetic", tmp_path, synthetic={"train_size": 50, "test_size": 10})
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(data.DatasetError, match="md5 mismatch"):
        data.verify_archive(cut, file_digest(archive, "md5"))
    with pytest.raises(data.DatasetError, match="truncated or corrupt"):
        data.extract_archive(cut, tmp_path / "out")


def test_archive_source_verifies_and_links(tmp_path):
    src = data.prepare_archive("synthetic", tmp_path / "a", synthetic={"train_size": 50, "test_size": 10})
    md5 = file_digest(src, "md5")
    linked = data.prepare_archive("archive", tmp_path / "b", archive=str(src), md5=md5)
    assert linked.resolve() == src.resolve()
    with pytest.raises(data.DatasetError, match="md5 mismatch"):
        data.prepare_archive("archive", tmp_path / "c", archive=str(src))  # official md5
    with pytest.raises(data.DatasetError, match="data.archive is empty"):
        data.prepare_archive("archive", tmp_path / "d", archive="")


def test_download_offline_says_what_to_do(tmp_path):
    with pytest.raises(data.DatasetError, match="data.source: archive"):
        data.download_archive("http://127.0.0.1:9/cifar-10-python.tar.gz", data.CIFAR_MD5, tmp_path)


def test_tensor_and_torchvision_paths_give_the_same_batches(cifar_dir):
    split = Split.load(cifar_dir, train=True)
    fast = TensorBatches(split, 64, seed=3, channels_last=False)
    seed_path = TorchvisionBatches(cifar_dir, split, 64, seed=3, channels_last=False)
    (xa, ya), (xb, yb) = next(fast.epoch(1)), next(seed_path.epoch(1))
    assert (ya == yb).all()
    assert (xa - xb).abs().max() < 1e-5  # (x/255-0.5)/0.5 both ways


def test_sharding_is_a_partition_like_distributed_sampler():
    order = epoch_order(10, seed=0, epoch=0)
    parts = [shard(order, r, 3) for r in range(3)]
    assert all(len(p) == 4 for p in parts)
    assert set(np.concatenate([p.numpy() for p in parts])) == set(range(10))
    assert not (epoch_order(10, 0, 0) == epoch_order(10, 0, 1)).all()


def test_seed_path_rejects_a_swapped_meta_file(cifar_dir, tmp_path):
    import shutil

    copy = tmp_path / "cifar-10-batches-py"
    shutil.copytree(cifar_dir, copy)
    (copy / data.META_FILE).write_bytes(pickle.dumps({"label_names": ["x"] * 10}))
    from cifarflow.engine.loaders import verified_cifar10

    with pytest.raises(RuntimeError, match="metadata file not found or corrupted"):
        verified_cifar10(copy, True, None)


def seed_net_class():
    """The seed's ``Net``, taken from bench/seed_cpu.py (the seed's script, verbatim but for
    its data path), so there is one copy of the seed's code in the project."""
    import ast

    import torch.nn as nn
    import torch.nn.functional as F

    from conftest import ROOT

    tree = ast.parse((ROOT / "bench" / "seed_cpu.py").read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Net")
    namespace = {"nn": nn, "F": F}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "seed_cpu.py", "exec"), namespace)
    return namespace["Net"]


def test_lenet_is_the_seeds_net():
    import torch

    from cifarflow.engine.models import build_model

    ours, seed = build_model("lenet"), seed_net_class()()
    seed.load_state_dict(ours.state_dict())  # same parameter names and shapes
    x = torch.randn(8, 3, 32, 32)
    assert torch.equal(ours(x), seed(x))
    ours(x).sum().backward(), seed(x).sum().backward()
    for (name, a), b in zip(ours.named_parameters(), seed.parameters()):
        assert torch.equal(a.grad, b.grad), name


# --- switching data.source: synthetic, archive, download, in any order -----------------

SMALL = {"train_size": 50, "test_size": 10}


@pytest.fixture
def served_archive(tmp_path):
    with served_tarball(tmp_path / "served", **SMALL) as served:
        yield served


def fetch_and_extract(source, dest, archive, url, md5):
    """What fetch_dataset then extract_dataset do for one config; the md5 of what was used."""
    options = {"synthetic": {"synthetic": SMALL}, "archive": {"archive": str(archive), "md5": md5},
               "download": {"url": url, "md5": md5}}[source]
    target = data.prepare_archive(source, dest, **options)
    data_id = data.fetch_record(target)["data_id"]
    data.verify_archive(target, data.expected_md5(target, data_id, md5))
    return file_digest(data.extract_archive(target, dest) / data.TEST_FILE, "md5")


def test_every_switch_of_source_works_in_place(tmp_path, served_archive):
    archive, url = served_archive
    real_md5 = file_digest(archive, "md5")
    real_test_batch = file_digest(archive.parent / data.BATCHES_DIR / data.TEST_FILE, "md5")
    dest = tmp_path / "results-data"
    order = ["synthetic", "archive", "download", "synthetic", "download", "archive", "synthetic"]
    seen = [fetch_and_extract(s, dest, archive, url, real_md5) for s in order]  # all 6 switches
    synthetic, real = seen[0], real_test_batch
    assert synthetic != real
    assert seen == [synthetic, real, real, synthetic, real, real, synthetic]
    assert archive.is_file() and file_digest(archive, "md5") == real_md5  # never written through the link
    assert not (dest / f"{data.ARCHIVE_NAME}.md5").exists()


def test_a_tarball_fetched_for_another_source_is_refused(tmp_path, served_archive):
    archive, _ = served_archive
    real_md5 = file_digest(archive, "md5")
    target = data.prepare_archive("synthetic", tmp_path, synthetic=SMALL)
    # the config now says archive, but fetch_dataset did not run again
    with pytest.raises(data.DatasetError, match="data.source synthetic.*--forcerun fetch_dataset"):
        data.expected_md5(target, real_md5, real_md5)
    target = data.prepare_archive("archive", tmp_path, archive=str(archive), md5=real_md5)
    synthetic_id = data.fetch_record(
        data.prepare_archive("synthetic", tmp_path / "other", synthetic=SMALL))["data_id"]
    with pytest.raises(data.DatasetError, match="data.source archive"):
        data.expected_md5(target, synthetic_id, real_md5)  # back to synthetic, fetch not rerun
    (tmp_path / f"{data.ARCHIVE_NAME}.fetched.json").unlink()
    with pytest.raises(data.DatasetError, match="no record of where it came from"):
        data.expected_md5(target, real_md5, real_md5)


def test_the_demo_sidecar_of_an_older_version_is_ignored(tmp_path, served_archive):
    """An older version left <tarball>.md5 beside the synthetic tarball and preferred it."""
    archive, _ = served_archive
    real_md5 = file_digest(archive, "md5")
    data.prepare_archive("synthetic", tmp_path, synthetic=SMALL)
    (tmp_path / f"{data.ARCHIVE_NAME}.md5").write_text(file_digest(tmp_path / data.ARCHIVE_NAME, "md5"))
    target = data.prepare_archive("archive", tmp_path, archive=str(archive), md5=real_md5)
    assert data.expected_md5(target, real_md5, real_md5) == real_md5
    assert not (tmp_path / f"{data.ARCHIVE_NAME}.md5").exists()


def test_download_with_a_wrong_md5_is_refused(tmp_path, served_archive):
    _, url = served_archive
    with pytest.raises(data.DatasetError, match="md5 mismatch"):
        data.prepare_archive("download", tmp_path, url=url, md5=data.CIFAR_MD5)
    assert data.fetch_record(tmp_path / data.ARCHIVE_NAME) is None
