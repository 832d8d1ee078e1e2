"""Synthetic images in CIFAR-10's form, for tests and sweeps without the download: smooth
per-class colour patterns plus pixel noise (learnable), written as the genuine files are,
Python 2 pickles (data.write_synthetic_archive puts them in the tarball). No torch."""

from __future__ import annotations

import io
import pickle

import numpy as np


class _Py2Pickler(pickle._Pickler):
    """Writes ``bytes`` and ``str`` as Python 2 ``str`` opcodes (BINSTRING), as the
    genuine CIFAR files (cPickle, Python 2) do; loading them needs encoding="latin1"."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes) -> None:
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + n.to_bytes(4, "little") + obj)
        self.memoize(obj)

    def save_py2_ascii(self, obj: str) -> None:
        self.save_py2_str(obj.encode("latin1"))

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_ascii


def py2_pickle(obj) -> bytes:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def synthesize_images(n: int, seed: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """Class-dependent images: a smooth per-class colour pattern plus pixel noise."""
    rng = np.random.default_rng(seed)
    proto_rng = np.random.default_rng(12345)  # same classes for every split and seed
    coarse = proto_rng.uniform(0, 255, size=(10, 3, 4, 4))
    prototypes = coarse.repeat(8, axis=2).repeat(8, axis=3)  # 10 x 3 x 32 x 32
    labels = rng.integers(0, 10, size=n)
    images = prototypes[labels] + rng.normal(0, noise * 255, size=(n, 3, 32, 32))
    return np.clip(images, 0, 255).astype(np.uint8), labels.astype(np.int64)


def batch_dict(images: np.ndarray, labels: np.ndarray, label: str) -> dict:
    """One batch file's dict, as the genuine files hold it (rows of 3072 bytes)."""
    return {b"batch_label": label.encode(), b"labels": [int(v) for v in labels],
            b"data": np.ascontiguousarray(images.reshape(len(images),
                                                                  int(np.prod(images.shape[1:])))),
            b"filenames": [f"synthetic_{i:06d}.png".encode() for i in range(len(labels))]}
