"""CIFAR-10 on disk: fetch, verify, extract, synthesise and load.

The on-disk format is the official one: ``cifar-10-python.tar.gz`` holding
``cifar-10-batches-py/`` with ``data_batch_1..5``, ``test_batch`` and
``batches.meta``, each a Python 2 pickle of a dict with ``data`` (uint8, N x 3072,
channel-major rows) and ``labels``.
"""

from __future__ import annotations

import io
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np

from .files import file_digest
from .synthetic import batch_dict, py2_pickle, synthesize_images

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR_MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE_NAME = "cifar-10-python.tar.gz"
BATCHES_DIR = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
MANIFEST = "manifest.json"
LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer",
               "dog", "frog", "horse", "ship", "truck"]
IMAGE_BYTES = 3 * 32 * 32


class DatasetError(RuntimeError):
    """A dataset problem the user can fix; the message says how."""


def download_archive(url: str, md5: str, dest_dir: Path) -> Path:
    """Fetch the official tarball with torchvision's downloader (login node only)."""
    from torchvision.datasets.utils import download_url

    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / ARCHIVE_NAME
    try:
        download_url(url, str(dest_dir), filename=ARCHIVE_NAME)  # md5: ours, says which
    except Exception as exc:  # urllib raises several types; all mean "no archive"
        raise DatasetError(
            f"could not download {url} ({type(exc).__name__}: {exc}). Compute nodes have "
            "no internet: fetch the tarball on a login node (wget it), then set "
            "data.source: archive and data.archive: /path/to/cifar-10-python.tar.gz"
        ) from exc
    verify_archive(target, md5)
    return target


def verify_archive(path: Path, md5: str) -> None:
    """Check the tarball exists, is complete and has the expected md5."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"archive not found: {path}")
    actual = file_digest(path, "md5")
    if actual != md5:
        raise DatasetError(
            f"md5 mismatch for {path}: expected {md5}, got {actual}. The file is truncated "
            "or not the official CIFAR-10 archive; re-fetch it, or set data.md5 to "
            f"{actual} if you trust this file"
        )


def extract_archive(archive: Path, out_dir: Path) -> Path:
    """Extract ``cifar-10-batches-py/`` into out_dir, validate it, write a manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(out_dir, filter="data")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DatasetError(f"cannot extract {archive}: {exc} (truncated or corrupt archive?)") from exc
    batches = out_dir / BATCHES_DIR
    files = {}
    for name in TRAIN_FILES + [TEST_FILE]:
        images, labels = read_batch(batches / name)
        files[name] = {"md5": file_digest(batches / name, "md5"), "images": int(len(labels))}
    meta = read_pickle(batches / META_FILE)
    files[META_FILE] = {"md5": file_digest(batches / META_FILE, "md5")}
    manifest = {"archive_md5": file_digest(archive, "md5"), "files": files,
                "label_names": meta.get("label_names", LABEL_NAMES)}
    (batches / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return batches


def read_pickle(path: Path) -> dict:
    """Load a CIFAR pickle; genuine files are Python 2 pickles (latin1, str or bytes keys)."""
    if not path.is_file():
        raise DatasetError(f"missing dataset file {path}; rerun the dataset rules")
    try:
        with open(path, "rb") as f:
            raw = pickle.load(f, encoding="latin1")
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise DatasetError(f"{path} is not a CIFAR-10 pickle: {exc}") from exc
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = read_pickle(path)
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch["labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != IMAGE_BYTES or len(labels) != len(data):
        raise DatasetError(f"{path}: expected data N x {IMAGE_BYTES} and N labels, "
                           f"got {data.shape} and {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise DatasetError(f"{path}: labels outside 0..9")
    return data.reshape(-1, 3, 32, 32), labels


def load_split(batches_dir: Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """All images (N, 3, 32, 32) uint8 and labels (N,) int64 of one split."""
    names = TRAIN_FILES if train else [TEST_FILE]
    parts = [read_batch(Path(batches_dir) / n) for n in names]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


# --- synthetic data in the real format (synthetic.py: the images, the pickles) ---------

def write_synthetic_archive(path: Path, train_size: int, test_size: int, seed: int,
                            noise: float = 0.35) -> str:
    """Write a learnable CIFAR-format tarball; returns its md5."""
    if train_size < 5:
        raise ValueError("synthetic train_size must be >= 5 (five training batches)")
    train_x, train_y = synthesize_images(train_size, seed, noise)
    test_x, test_y = synthesize_images(test_size, seed + 1, noise)
    chunks = np.array_split(np.arange(train_size), len(TRAIN_FILES))
    members = {}
    for i, (name, idx) in enumerate(zip(TRAIN_FILES, chunks), start=1):
        members[name] = batch_dict(train_x[idx], train_y[idx], f"training batch {i} of 5")
    members[TEST_FILE] = batch_dict(test_x, test_y, "testing batch 1 of 1")
    members[META_FILE] = {b"label_names": [n.encode() for n in LABEL_NAMES],
                          b"num_cases_per_batch": int(len(chunks[0])), b"num_vis": IMAGE_BYTES}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name, obj in members.items():
            blob = py2_pickle(obj)
            info = tarfile.TarInfo(f"{BATCHES_DIR}/{name}")
            info.size, info.mtime, info.mode = len(blob), 0, 0o644
            tar.addfile(info, io.BytesIO(blob))
    tmp.replace(path)
    return file_digest(path, "md5")


def prepare_archive(source: str, dest_dir: Path, *, url: str = CIFAR_URL, md5: str = CIFAR_MD5,
                    archive: str | None = None, synthetic: dict | None = None,
                    data_id: str | None = None) -> Path:
    """Bring the tarball for ``source`` (download | archive | synthetic) into dest_dir and
    record beside it where it came from (``fetch_record``). Whatever an earlier source left
    there goes first: a link to the user's archive is never written through."""
    from .config import data_identity
    from .schema import fill_defaults, schema

    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / ARCHIVE_NAME
    for stale in (target, _record_path(target), Path(f"{target}.md5")):  # .md5: older versions
        if stale.exists() or stale.is_symlink():
            stale.unlink()
    if source == "download":
        download_archive(url, md5, dest_dir)
        verified = md5
    elif source == "archive":
        if not archive:
            raise DatasetError("data.source is 'archive' but data.archive is empty: "
                               "set it to the path of cifar-10-python.tar.gz")
        verify_archive(Path(archive), md5)
        target.symlink_to(Path(archive).resolve())
        verified = md5
    elif source == "synthetic":
        synthetic = fill_defaults(synthetic, schema()["properties"]["data"]["properties"]["synthetic"])
        verified = write_synthetic_archive(target, int(synthetic["train_size"]),
                                           int(synthetic["test_size"]), int(synthetic["seed"]),
                                           float(synthetic["noise"]))
    else:
        raise DatasetError(f"unknown data.source {source!r}: use download, archive or synthetic")
    if data_id is None:
        data_id = data_identity({"source": source, "md5": md5, "synthetic": synthetic})
    record = {"source": source, "data_id": data_id, "md5": verified}
    _record_path(target).write_text(json.dumps(record) + "\n")
    return target


def _record_path(archive: Path) -> Path:
    return Path(f"{archive}.fetched.json")


def fetch_record(archive: Path) -> dict | None:
    """What fetch-data wrote beside the tarball: its source, data id and verified md5."""
    path = _record_path(archive)
    return json.loads(path.read_text()) if path.is_file() else None


def expected_md5(archive: Path, data_id: str, configured: str) -> str:
    """The md5 the tarball must have for the config whose data id is ``data_id``: the
    configured one for real data, the generated archive's own for synthetic data. A tarball
    fetched for another source or other parameters is refused, never accepted."""
    record = fetch_record(archive)
    if record is None or record.get("data_id") != data_id:
        was = (f"was fetched for data id {record['data_id']} (data.source {record['source']})"
               if record else "has no record of where it came from")
        raise DatasetError(
            f"{archive} {was}, but the config's data id is {data_id}: fetch it again, "
            "`snakemake --forcerun fetch_dataset` (a plain rerun does it when data.source, "
            "data.md5 or the synthetic parameters changed, unless --rerun-triggers leaves "
            "out params)")
    return record["md5"] if record["source"] == "synthetic" else configured
