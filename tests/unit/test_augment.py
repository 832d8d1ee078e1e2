"""Augmentation on the device (engine/augment.py and the loaders), label smoothing and the
test-time flip: pixel-exact on known images, draws a pure function of (seed, epoch, batch,
rank), and the loss and accuracies as their definitions say."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import spec
from cifarflow.config import NEUTRAL, SHAPING_FIELDS, TrainConfig, resolve_augment
from cifarflow.engine.augment import Augment, Draws, apply, draw_seed, draws, mirror
from cifarflow.engine.loaders import Split, TensorBatches, TorchvisionBatches, normalize

CL = torch.channels_last


def known(n=2, c=3, h=5, w=6, dtype=torch.uint8):
    """Images whose every pixel is distinct: value = 100 n + 10 row + col (+ channel)."""
    n_, c_, r, k = torch.meshgrid(*(torch.arange(s) for s in (n, c, h, w)), indexing="ij")
    return (100 * n_ + 10 * r + k + c_).to(dtype)


def test_flip_and_translate_a_known_image_pixel_exactly():
    x = known(n=1, c=1, h=3, w=4)  # rows 0..3, 10..13, 20..23
    flip = Draws(torch.tensor([True]), None)
    assert apply(x, flip)[0, 0].tolist() == [[3, 2, 1, 0], [13, 12, 11, 10], [23, 22, 21, 20]]
    right_down = Draws(None, torch.tensor([[1, 1]]))  # dx = +1 (right), dy = +1 (down)
    assert apply(x, right_down)[0, 0].tolist() == [[0, 0, 0, 0], [0, 0, 1, 2], [0, 10, 11, 12]]
    left_up = Draws(None, torch.tensor([[-2, -1]]))
    assert apply(x, left_up)[0, 0].tolist() == [[12, 13, 0, 0], [22, 23, 0, 0], [0, 0, 0, 0]]
    both = Draws(torch.tensor([True]), torch.tensor([[1, 0]]))  # mirrored, then moved right
    assert apply(x, both)[0, 0].tolist() == [[0, 3, 2, 1], [0, 13, 12, 11], [0, 23, 22, 21]]
    assert apply(x.float(), both, fill=-1.0)[0, 0].tolist() == \
        [[-1, 3, 2, 1], [-1, 13, 12, 11], [-1, 23, 22, 21]]
    assert x[0, 0, 0].tolist() == [0, 1, 2, 3]  # the input is left as it was


def reference(x, d: Draws, fill=0):
    """The rule, one pixel at a time: out[i, j] = mirrored-or-not image at (i - dy, j - dx)."""
    n, c, h, w = x.shape
    out = torch.full_like(x, fill)
    for k in range(n):
        img = x[k].flip(2) if d.flip is not None and d.flip[k] else x[k]
        dx, dy = d.shift[k].tolist() if d.shift is not None else (0, 0)
        for i in range(h):
            for j in range(w):
                if 0 <= i - dy < h and 0 <= j - dx < w:
                    out[k, :, i, j] = img[:, i - dy, j - dx]
    return out


@pytest.mark.parametrize("flip,crop", [(True, 0), (False, 3), (True, 2)])
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "float"])
def test_whole_batch_ops_match_the_per_pixel_rule_in_every_layout(flip, crop, layout):
    x = known(n=12, h=8, w=8)  # 8-byte rows: the word path; w=5 below: the byte path
    for images in (x, known(n=12, h=7, w=5)):
        d = draws(len(images), seed=3, epoch=1, batch=4, flip=flip, crop=crop)
        expected = reference(images, d)
        if layout == "channels_last":
            images = images.contiguous(memory_format=CL)
        elif layout == "float":
            images, expected = images.float(), expected.float()
        out = apply(images, d)
        assert out.dtype == images.dtype and torch.equal(out, expected)
        assert out.is_contiguous(memory_format=CL) == (layout == "channels_last")


def test_draws_are_a_pure_function_of_seed_epoch_batch_and_rank():
    def get(*args, crop=4):
        d = draws(256, *args, flip=True, crop=crop)
        return torch.cat([d.flip.long()[:, None], d.shift], 1)

    base = get(0, 2, 5, 0)
    assert torch.equal(base, get(0, 2, 5, 0))  # every call
    for other in [(0, 2, 6, 0), (0, 3, 5, 0), (1, 2, 5, 0), (0, 2, 5, 1)]:  # batch, epoch,
        assert not torch.equal(base, get(*other))                            # seed, rank
    assert draw_seed(0, 1, 23, 0) != draw_seed(0, 12, 3, 0)  # no collision of concatenation
    shifts = base[:, 1:]
    assert shifts.min() == -4 and shifts.max() == 4  # the whole range, nothing past it
    assert 80 < int(base[:, 0].sum()) < 176  # a fair coin (p < 1e-7 of failing by chance)
    assert draws(8, 0, 0, 0).flip is None and draws(8, 0, 0, 0).shift is None


def split_of(n=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return Split(torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=gen),
                 torch.randint(0, 10, (n,), generator=gen))


def test_tensor_batches_augment_each_batch_with_its_own_draws_and_resume_exactly():
    split, aug = split_of(), {"flip": True, "crop": 4}
    plain = TensorBatches(split, 64, seed=5, channels_last=True)
    batches = TensorBatches(split, 64, seed=5, channels_last=True, augment=aug)
    full = list(batches.epoch(2))
    idx = batches.indices(2)
    for b, (x, y) in enumerate(full):
        raw = split.images[idx[b * 64:(b + 1) * 64]]
        d = draws(len(raw), 5, 2, b, 0, flip=True, crop=4)
        assert torch.equal(x, normalize(apply(raw, d), True))
        assert x.is_contiguous(memory_format=CL)
        assert torch.equal(y, split.labels[idx[b * 64:(b + 1) * 64]])
    # plain batches are untouched; augmented ones differ
    assert all(not torch.equal(a[0], p[0]) for a, p in zip(full, plain.epoch(2)))
    # a resume at batch 3 sees exactly the batches the uninterrupted epoch saw
    for (x, y), (xr, yr) in zip(full[3:], batches.epoch(2, start=3), strict=True):
        assert torch.equal(x, xr) and torch.equal(y, yr)
    # ddp: two ranks draw different choices for their batch b
    r0 = TensorBatches(split, 64, seed=5, rank=0, world_size=2, augment=aug)
    r1 = TensorBatches(split, 64, seed=5, rank=1, world_size=2, augment=aug)
    assert r0.augment.draws(64, 5, 0, 0, 0).shift.tolist() != \
        r1.augment.draws(64, 5, 0, 0, 1).shift.tolist()
    x1 = next(iter(r1.epoch(0)))[0]
    raw1 = split.images[r1.indices(0)[:64]]
    assert torch.equal(x1, normalize(apply(raw1, draws(64, 5, 0, 0, 1, flip=True, crop=4)), True))


def test_the_torchvision_loader_gives_the_tensor_loaders_augmented_images(cifar_dir):
    split = Split.load(cifar_dir, train=True)
    aug = Augment(flip=True, crop=3)
    tensor = TensorBatches(split, 200, seed=1, augment=aug)
    vision = TorchvisionBatches(cifar_dir, split, 200, seed=1, augment=aug)
    for (x, y), (xv, yv) in zip(tensor.epoch(1, start=4), vision.epoch(1, start=4), strict=True):
        assert torch.equal(y, yv)
        assert torch.allclose(x, xv, atol=1e-6, rtol=0)  # the same images, float rounding apart


def test_model_defaults_are_resolved_in_one_place_and_planned_into_the_spec():
    assert resolve_augment("lenet", {"flip": "auto", "crop": "auto"}) == {"flip": False, "crop": 0}
    assert resolve_augment("resnet18", {}) == {"flip": True, "crop": 4}
    assert resolve_augment("fastnet", {"crop": 0}) == {"flip": True, "crop": 0}
    assert resolve_augment("pkg.mod:net", {"flip": "auto"}) == {"flip": False, "crop": 0}
    assert TrainConfig.read(spec()).augment == {"flip": False, "crop": 0}  # the seed's lenet
    cfg = TrainConfig.read(spec(model="resnet18", label_smoothing=0.1, tta="flip"))
    assert (cfg.augment, cfg.label_smoothing, cfg.tta) == ({"flip": True, "crop": 4}, 0.1, "flip")
    with pytest.raises(ValueError, match="augment must be"):
        TrainConfig.from_dict({**cfg.to_dict(), "augment": {"flip": "auto", "crop": 4}})


def test_checkpoints_from_before_augmentation_still_resume():
    """A run under way when this version arrives: its checkpoint's config has no augment and
    no label_smoothing, and it trained with neither; the upgraded plan (lenet: none) resumes
    it, and its config hash is the one it had."""
    import hashlib
    import json

    cfg = TrainConfig.read(spec())
    old = {k: v for k, v in cfg.to_dict().items() if k not in NEUTRAL}
    assert cfg.shaping_diff(old) == {}
    old_fields = [k for k in SHAPING_FIELDS if k not in NEUTRAL]
    old_hash = hashlib.sha256(json.dumps({k: old[k] for k in old_fields},
                                         sort_keys=True).encode()).hexdigest()[:16]
    assert cfg.shaping_hash() == old_hash
    smoothed = TrainConfig.read(spec(label_smoothing=0.2))
    assert smoothed.shaping_diff(old) == {"label_smoothing": (0.0, 0.2)}
    assert smoothed.shaping_hash() != old_hash
    assert TrainConfig.read(spec(tta="flip")).shaping_hash() == old_hash  # eval only


def step_of(model, test_split=None, **kw):
    """One run's step (engine/step.py) over ``model``, with nothing built but the model."""
    from cifarflow.engine.step import PlainStep
    from cifarflow.engine.strategies import get_strategy

    cfg = TrainConfig.read(spec(**kw))
    run = SimpleNamespace(cfg=cfg, strategy=get_strategy("cpu")(cfg, 1), batches=None,
                          model=model, optimizer=None, scheduler=None, test_split=test_split)
    return PlainStep(run)


def test_label_smoothing_changes_the_loss_as_cross_entropy_defines_it():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen)
    losses = {}
    for eps in (0.0, 0.2):
        torch.manual_seed(0)
        seg = step_of(nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10)),
                      label_smoothing=eps)
        out = seg.model(x)
        loss, hits = seg.compute(x, y)
        logp = F.log_softmax(out, 1)
        by_hand = ((1 - eps) * -logp.gather(1, y[:, None]).squeeze(1) - eps * logp.mean(1)).mean()
        assert torch.allclose(loss, by_hand, atol=1e-6)
        assert torch.equal(loss, F.cross_entropy(out, y, label_smoothing=eps))
        assert int(hits) == int((out.argmax(1) == y).sum())  # accuracy is not smoothed
        losses[eps] = float(loss.detach())
    assert not math.isclose(losses[0.0], losses[0.2])


class LeftRight(nn.Module):
    """Logits of the left and right halves' brightness: its mirror prediction differs."""

    def forward(self, x):
        left, right = x[..., :16].mean((1, 2, 3)), x[..., 16:].mean((1, 2, 3))
        zeros = torch.zeros(len(x), 7)
        return torch.cat([left[:, None], right[:, None], torch.full((len(x), 1), 0.1), zeros], 1)


@pytest.mark.parametrize("tta", ["none", "flip"])
def test_test_time_flip_scores_the_mean_of_image_and_mirror(tta):
    """Bright left half, dark right: plain logits (1, -1, 0.1) say class 0, the mirror's
    (-1, 1, 0.1) class 1, their mean (0, 0, 0.1) class 2. Labels 0, 2, 2, 2 (and the
    mirrored image with labels 1, 1): plain 3 of 6 right, with the flip 3 of 6 others."""
    images = torch.zeros(6, 3, 32, 32, dtype=torch.uint8)
    images[:4, :, :, :16] = 255
    images[4:, :, :, 16:] = 255
    kw = dict(tta=tta, eval_batch_size=4, channels_last=True)
    [accs] = step_of(LeftRight(), Split(images, torch.tensor([0, 2, 2, 2, 1, 1])),
                     **kw).evaluate()
    assert accs["test_acc"] == pytest.approx(3 / 6)
    if tta == "flip":
        assert accs["test_acc_tta"] == pytest.approx(3 / 6)
        [accs] = step_of(LeftRight(), Split(images[:4], torch.tensor([0, 2, 2, 2])),
                         **kw).evaluate()
        assert accs == pytest.approx({"test_acc": 1 / 4, "test_acc_tta": 3 / 4})
    else:
        assert "test_acc_tta" not in accs


def test_mirror_keeps_the_memory_format():
    x = known(n=2, h=4, w=4).float().contiguous(memory_format=CL)
    assert torch.equal(mirror(x), x.flip(3)) and mirror(x).is_contiguous(memory_format=CL)


def test_an_epochs_draws_made_at_once_are_each_batchs_draws():
    """Augment.epoch: every batch's draws of an epoch in one call (300 images in batches of
    64, the last of 44), batch b's exactly what draws(seed, epoch, b, rank) gives."""
    aug = Augment(flip=True, crop=4)
    made = aug.epoch(300, 64, seed=5, epoch=2, rank=1)
    for b, n in enumerate([64, 64, 64, 64, 44]):
        d = made.batch(b)
        alone = draws(n, 5, 2, b, 1, flip=True, crop=4)
        assert torch.equal(d.flip, alone.flip) and torch.equal(d.shift, alone.shift), b
    crop_only = Augment(crop=2).epoch(100, 64, seed=0, epoch=0).batch(1)
    assert crop_only.flip is None and len(crop_only.shift) == 36


@pytest.mark.parametrize("per_member", [False, True], ids=["gathered", "loop"])
def test_a_fused_group_draws_once_an_epoch_per_member_not_per_step(monkeypatch, per_member):
    """Three members of other seeds (each its own draws) in fused batches: the draws of an
    epoch are made at its first batch, once per member (3 an epoch, not 3 x 5 steps
    spread over the steps), none while the steps run; each member's images are those it
    would see alone."""
    from cifarflow.engine import augment
    from cifarflow.engine.fused.batches import FusedBatches

    made, drawn = [], []
    epoch, draw = Augment.epoch, augment.draws
    monkeypatch.setattr(Augment, "epoch", lambda self, *a, **k: (made.append(a),
                                                                epoch(self, *a, **k))[1])
    monkeypatch.setattr(augment, "draws", lambda *a, **k: (drawn.append(a), draw(*a, **k))[1])
    split, aug = split_of(), {"flip": True, "crop": 4}
    members = [TensorBatches(split, 64, seed=s, augment=aug) for s in (1, 2, 3)]
    fused = FusedBatches(members)
    fused.per_member = per_member
    assert not fused.shared
    seen = []
    for e in (0, 1):
        batches = fused.epoch(e)
        first = next(batches)
        at_first = len(drawn)
        seen.append([first, *batches])
        assert len(made) == 3 * (e + 1) and len(drawn) == at_first == 3 * 5 * (e + 1)
    for e, epoch_batches in enumerate(seen):
        for k, m in enumerate(members):
            alone = TensorBatches(split, 64, seed=m.seed, augment=aug).epoch(e)
            for b, ((x, _), (xa, _)) in enumerate(zip(epoch_batches, alone, strict=True)):
                assert torch.equal(x[k], xa), (e, b, k)
