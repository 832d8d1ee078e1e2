"""Batches for training and evaluation.

Two interchangeable paths that visit images in the same order:

* ``tensor`` (default): the whole uint8 split held in memory (on a GPU: in GPU memory,
  150 MB for CIFAR-10's training split, so no batch crosses PCIe), each batch gathered,
  cast and normalised in one vectorised step, optionally channels_last.
* ``torchvision``: the seed's path, ``CIFAR10`` + ``ToTensor``/``Normalize`` per image
  through a ``DataLoader`` with ``num_workers``, kept for comparison.

The order of epoch ``e`` is a pure function of (seed, e), so a run can resume at any
batch without saving sampler internals, and rank ``r`` of ``w`` takes every w-th index
of the padded order exactly like ``DistributedSampler``.

Both apply ``train.augment`` (``augment.py``) to each training batch, on its device, with
the draws of (seed, epoch, batch, rank): the tensor loader to the gathered uint8 pixels
before normalising, the torchvision loader to the collated [0, 1] batch before its
``Normalize`` (so both give the same images; a per-image transform would draw from the
workers' RNGs, which a resume cannot replay). Test batches are never augmented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import data
from .augment import Augment, apply

MEAN = STD = 0.5  # the seed's Normalize((0.5,)*3, (0.5,)*3)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The training split's order in ``epoch``: a pure function of (seed, epoch)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen)


def shard(order: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Pad to a multiple of world_size by wrapping around, then take rank::world_size."""
    total = math.ceil(len(order) / world_size) * world_size
    if total > len(order):
        order = torch.cat([order, order[: total - len(order)]])
    return order[rank::world_size]


@dataclass
class Split:
    images: torch.Tensor  # (N, 3, 32, 32) uint8
    labels: torch.Tensor  # (N,) int64

    @classmethod
    def load(cls, batches_dir: Path, train: bool) -> "Split":
        x, y = data.load_split(batches_dir, train)
        return cls(torch.from_numpy(x), torch.from_numpy(y))

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device) -> "Split":
        return Split(self.images.to(device), self.labels.to(device))


def normalize(batch_u8: torch.Tensor, channels_last: bool) -> torch.Tensor:
    x = batch_u8.float().mul_(1.0 / (255.0 * STD)).sub_(MEAN / STD)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


class TensorBatches:
    """Yields (images, labels) batches of one epoch, starting at batch ``start``."""

    on_device = True  # the split is copied to the device once; batches are gathered there

    def __init__(self, split: Split, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, channels_last: bool = True, device: str = "cpu",
                 augment: Augment | dict | None = None):
        self.split, self.batch_size, self.seed = split, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.channels_last, self.device = channels_last, device
        self.augment = augment if isinstance(augment, Augment) else Augment.of(augment)
        self._draws = None  # (epoch, its EpochDraws)
        if self.on_device:
            self.split = split.to(device)

    def indices(self, epoch: int) -> torch.Tensor:
        return shard(epoch_order(len(self.split), self.seed, epoch),
                     self.rank, self.world_size)

    @property
    def rank_images(self) -> int:
        """The images of an epoch on this rank (``indices``' length)."""
        return math.ceil(len(self.split) / self.world_size)

    def __len__(self) -> int:
        return math.ceil(self.rank_images / self.batch_size)

    def augmented(self, x: torch.Tensor, epoch: int, batch: int, fill: float = 0) -> torch.Tensor:
        """Batch ``batch`` of ``epoch`` (its pixels ``x``) as this run's ``train.augment``
        changes it on this rank (the epoch's draws, ``epoch_draws``): ``x`` itself when
        augmentation is off. A fused step's batches call it for each member (its own seed)."""
        draws = self.epoch_draws(epoch)
        return x if draws is None else apply(x, draws.batch(batch).to(x.device), fill)

    def epoch_draws(self, epoch: int):
        """The augmentation's draws of every batch of ``epoch`` on this rank, made once an
        epoch (at its first batch) and kept on the split's device; None when it is off."""
        if not self.augment:
            return None
        if self._draws is None or self._draws[0] != epoch:
            self._draws = epoch, self.augment.epoch(self.rank_images, self.batch_size,
                                                    self.seed, epoch, self.rank,
                                                    self.split.images.device)
        return self._draws[1]

    def epoch(self, epoch: int, start: int = 0):
        idx = self.indices(epoch).to(self.split.images.device)
        for b in range(start, len(self)):
            sel = idx[b * self.batch_size:(b + 1) * self.batch_size]
            x = self.augmented(self.split.images.index_select(0, sel), epoch, b)
            y = self.split.labels.index_select(0, sel)
            yield normalize(x, self.channels_last), y


class _OrderSampler(torch.utils.data.Sampler):
    def __init__(self, indices: torch.Tensor):
        self._indices = indices.tolist()

    def __iter__(self):
        return iter(self._indices)

    def __len__(self) -> int:
        return len(self._indices)


def verified_cifar10(batches_dir: Path, train: bool, transform):
    """torchvision's CIFAR10 class, checked against our manifest instead of the
    official per-file md5s (which synthetic or re-packed data cannot match)."""
    import json
    from torchvision.datasets import CIFAR10

    manifest = json.loads((Path(batches_dir) / data.MANIFEST).read_text())["files"]
    md5 = {name: entry["md5"] for name, entry in manifest.items()}
    if data.META_FILE not in md5:
        raise data.DatasetError(f"{batches_dir}/{data.MANIFEST} predates this version: "
                                "delete the directory and rerun extract_dataset")
    cls = type("ManifestCIFAR10", (CIFAR10,), {
        "train_list": [[n, md5[n]] for n in data.TRAIN_FILES],
        "test_list": [[data.TEST_FILE, md5[data.TEST_FILE]]],
        "meta": dict(CIFAR10.meta, md5=md5[data.META_FILE]),
    })
    return cls(root=str(Path(batches_dir).parent), train=train, download=False,
               transform=transform)


class TorchvisionBatches(TensorBatches):
    """The seed's per-image transform pipeline, same order as TensorBatches."""

    on_device = False  # its DataLoader reads the files; the split gives the length only

    def __init__(self, batches_dir: Path, split: Split, batch_size: int, seed: int,
                 num_workers: int = 0, train: bool = True, **kw):
        super().__init__(split, batch_size, seed, **kw)
        import torchvision.transforms as T

        # augmented: Normalize after the batch's augmentation (epoch), the same arithmetic
        transform = (T.ToTensor() if self.augment else
                     T.Compose([T.ToTensor(), T.Normalize((MEAN,) * 3, (STD,) * 3)]))
        self.dataset = verified_cifar10(batches_dir, train, transform)
        self.num_workers = num_workers
        self.pin_memory = self.device != "cpu"

    def epoch(self, epoch: int, start: int = 0):
        idx = self.indices(epoch)[start * self.batch_size:]
        loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=self.batch_size, sampler=_OrderSampler(idx),
            num_workers=self.num_workers, pin_memory=self.pin_memory,
            persistent_workers=False)
        for b, (x, y) in enumerate(loader, start):
            if self.device != "cpu":
                x = x.to(self.device, non_blocking=True)
                y = y.to(self.device, non_blocking=True)
            if self.augment:  # as T.Normalize computes it, after the augmentation
                x = self.augmented(x, epoch, b).sub_(MEAN).div_(STD)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, y


def eval_batches(split: Split, batch_size: int, rank: int, world_size: int,
                 channels_last: bool, device: str):
    """Test batches of this rank with a validity mask: every rank runs the same number
    of forward passes (FSDP needs that) and padded duplicates are not counted."""
    n = len(split)
    total = math.ceil(n / world_size) * world_size
    positions = torch.arange(total)[rank::world_size]
    valid = (positions < n).to(device)
    idx = (positions % n).to(split.images.device)
    for b in range(0, len(idx), batch_size):
        sel = idx[b:b + batch_size]
        x = split.images.index_select(0, sel).to(device, non_blocking=True)
        y = split.labels.index_select(0, sel).to(device, non_blocking=True)
        yield normalize(x, channels_last), y, valid[b:b + batch_size]
