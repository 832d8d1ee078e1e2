"""Training-time augmentation as whole-batch tensor ops, on whichever device the batch is.

Two parts, so that any loader (plain, pack, ddp rank, a fused group's member) can use them:

* ``draws(n, seed, epoch, batch, rank, flip=, crop=)``: the random choices of one batch, a
  pure function of (seed, epoch, batch index, rank). They come from a CPU
  ``torch.Generator`` seeded from those four numbers and are then moved to the batch's
  device, so they are the same on every device and every call: a run resumed at batch b
  draws exactly what it would have drawn in one go, and rank r of a ddp run draws other
  choices than rank 0.
* ``apply(x, d, fill=0)``: those choices applied to a batch of shape (N, C, H, W), uint8 or
  float, in its memory format: image n mirrored left-right where ``d.flip[n]``, then
  translated by ``d.shift[n] = (dx, dy)`` pixels (content moves right by dx, down by dy);
  pixels that enter from outside are ``fill`` (0: black on uint8 pixels, as torchvision's
  ``RandomCrop(32, padding=crop)`` pads). One advanced-indexing gather, no per-image Python.

``Augment`` ties the two to a run's ``train.augment``; ``mirror`` is the test-time flip.
``Augment.epoch`` makes the draws of a whole epoch at its start (``EpochDraws``: the same
draws, batch by batch), copied to a CUDA device at once from pinned memory, so a training
step neither draws nor waits for a copy from the host.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

_TAG = "cifarflow-augment-v1"  # a stream of its own: never the epoch order's generator


def draw_seed(seed: int, epoch: int, batch: int, rank: int = 0) -> int:
    """The generator seed of one batch's draws: a hash of (seed, epoch, batch, rank)."""
    text = f"{_TAG}:{seed}:{epoch}:{batch}:{rank}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class Draws:
    """One batch's choices: ``flip`` (N,) bool or None, ``shift`` (N, 2) int64 (dx, dy) or None."""
    flip: torch.Tensor | None
    shift: torch.Tensor | None

    def each(self, change) -> "Draws":
        """``change`` applied to each kind of draw there is (flip, shift)."""
        return Draws(*(None if t is None else change(t) for t in (self.flip, self.shift)))

    @staticmethod
    def _join(parts: list, join) -> "Draws":
        first = parts[0]
        return Draws(None if first.flip is None else join([d.flip for d in parts]),
                     None if first.shift is None else join([d.shift for d in parts]))

    @staticmethod
    def cat(parts: list) -> "Draws":
        """The draws of several batches, one after another (a fused group's members)."""
        return Draws._join(parts, torch.cat)

    @staticmethod
    def stack(parts: list) -> "Draws":
        """The draws of several members, one row each: flip (K, N), shift (K, N, 2)."""
        return Draws._join(parts, torch.stack)

    def rows(self, start: int, stop: int) -> "Draws":
        """Images start..stop of each member's row of stacked draws (``stack``), the
        members' one after another: flip (K x n,), shift (K x n, 2)."""
        return self.each(lambda t: t[:, start:stop].reshape(-1, *t.shape[2:]))

    def to(self, device) -> "Draws":
        return self.each(lambda t: t.to(device))


def draws(n: int, seed: int, epoch: int, batch: int, rank: int = 0, *, flip: bool = False,
          crop: int = 0, device="cpu") -> Draws:
    """The choices for batch ``batch`` (0-based) of ``epoch`` (0-based) on ``rank``, ``n``
    images: a fair coin per image for ``flip``, and (dx, dy) uniform in [-crop, crop] each for
    ``crop`` > 0. Drawn on the CPU, then moved to ``device``."""
    gen = torch.Generator().manual_seed(draw_seed(seed, epoch, batch, rank))
    mirror = torch.randint(0, 2, (n,), generator=gen).bool() if flip else None
    shift = torch.randint(-crop, crop + 1, (n, 2), generator=gen) if crop > 0 else None
    return Draws(mirror, shift).to(device)


class EpochDraws:
    """The draws of every batch of one epoch (seed, rank), made at once and kept on the
    batches' device: ``batch(b)`` is what ``draws`` gives for batch b (a view)."""

    def __init__(self, parts: list, batch_size: int, device):
        self.batch_size = batch_size
        made = Draws.cat(parts)
        if str(device).startswith("cuda"):  # one copy, queued, from page-locked memory
            made = made.each(lambda t: t.pin_memory().to(device, non_blocking=True))
        self.draws = made

    def batch(self, b: int) -> Draws:
        return self.draws.each(lambda t: t[b * self.batch_size:(b + 1) * self.batch_size])


def _memory_format(x: torch.Tensor):
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def apply(x: torch.Tensor, d: Draws, fill: float = 0) -> torch.Tensor:
    """``x`` (N, C, H, W) with draws ``d`` applied (a new tensor of x's dtype, device and
    memory format; ``x`` itself is not changed). See the module's docstring for the rule.

    Two gathers with (N, W) and (N, H) indices broadcast over the rest (never a full-size
    index tensor): one along the width (mirror and horizontal shift at once), one along the
    height, which moves whole rows and so runs on 8-byte words where the rows allow it; then
    the pixels that came from outside are set to ``fill``."""
    if d.flip is None and d.shift is None:
        return x
    n, _, h, w = x.shape
    dev = x.device
    channels_last = _memory_format(x) is torch.channels_last
    v = x.permute(0, 2, 3, 1) if channels_last else x  # contiguous (N,H,W,C) or (N,C,H,W)
    hdim, wdim = (1, 2) if channels_last else (2, 3)
    cols = torch.arange(w, device=dev).expand(n, w)
    rows = keep = None
    if d.shift is not None:
        shift = d.shift.to(dev)
        cols = cols - shift[:, 0:1]  # out[.., j] = in[.., j - dx]
        rows = torch.arange(h, device=dev).expand(n, h) - shift[:, 1:2]
        keep = (((rows >= 0) & (rows < h))[:, :, None] & ((cols >= 0) & (cols < w))[:, None, :])
        cols, rows = cols.clamp(0, w - 1), rows.clamp(0, h - 1)
    if d.flip is not None:
        cols = torch.where(d.flip.to(dev)[:, None], (w - 1) - cols, cols)
    v = v.gather(wdim, _along(cols, wdim, v.shape))
    if rows is not None:
        v = _gather_rows(v, hdim, rows)
        keep = keep[:, :, :, None] if channels_last else keep[:, None]
        v = v.mul_(keep) if fill == 0 else torch.where(keep, v, torch.tensor(fill, dtype=v.dtype,
                                                                               device=dev))
    return v.permute(0, 3, 1, 2) if channels_last else v


def _along(idx: torch.Tensor, dim: int, shape) -> torch.Tensor:
    """An (N, L) index placed at ``dim`` of a tensor of ``shape`` (N first), broadcast over
    the other dimensions with stride 0 (no copy)."""
    view = [idx.shape[0]] + [1] * (len(shape) - 1)
    view[dim] = idx.shape[1]
    return idx.view(view).expand(*shape[:dim], idx.shape[1], *shape[dim + 1:])


def _gather_rows(v: torch.Tensor, dim: int, rows: torch.Tensor) -> torch.Tensor:
    """``v`` with its slices along ``dim`` taken from ``rows``: each slice (a row of W pixels,
    or W x C in channels_last) is contiguous, so where its bytes make whole 8-byte words the
    gather moves words, 8 uint8 pixels at a time."""
    shape = v.shape
    flat = v.reshape(*shape[:dim + 1], -1)  # a view: v is contiguous
    if (flat.shape[-1] * v.element_size()) % 8 == 0 and flat.data_ptr() % 8 == 0:
        words = flat.view(torch.int64)
        return words.gather(dim, _along(rows, dim, words.shape)).view(v.dtype).view(shape)
    return v.gather(dim, _along(rows, dim, shape))


def mirror(x: torch.Tensor) -> torch.Tensor:
    """Every image of ``x`` mirrored left-right, in x's memory format (test-time flip)."""
    return x.flip(3).contiguous(memory_format=_memory_format(x))


@dataclass(frozen=True)
class Augment:
    """A run's ``train.augment`` (resolved: ``config.resolve_augment``) for one seed."""
    flip: bool = False
    crop: int = 0

    @classmethod
    def of(cls, spec: dict | None) -> "Augment":
        spec = spec or {}
        return cls(bool(spec.get("flip", False)), int(spec.get("crop", 0)))

    def __bool__(self) -> bool:
        return self.flip or self.crop > 0

    def draws(self, n: int, seed: int, epoch: int, batch: int, rank: int = 0,
              device="cpu") -> Draws:
        return draws(n, seed, epoch, batch, rank, flip=self.flip, crop=self.crop, device=device)

    def epoch(self, images: int, batch_size: int, seed: int, epoch: int, rank: int = 0,
              device="cpu") -> EpochDraws:
        """The draws of every batch of ``epoch`` over ``images`` images in batches of
        ``batch_size`` (the last one partial), at once: batch b's are ``draws``' for b."""
        sizes = [min(batch_size, images - start) for start in range(0, images, batch_size)]
        return EpochDraws([self.draws(n, seed, epoch, b, rank) for b, n in enumerate(sizes)],
                          batch_size, device)

    def batch(self, x: torch.Tensor, seed: int, epoch: int, batch: int, rank: int = 0,
              fill: float = 0) -> torch.Tensor:
        """``x`` augmented with the draws of (seed, epoch, batch, rank); ``x`` as is when off."""
        if not self:
            return x
        return apply(x, self.draws(len(x), seed, epoch, batch, rank, x.device), fill)
