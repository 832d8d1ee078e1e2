"""Planning fused packs (pack.fuse): which runs share a fused model, and the one line that
says how a sweep split."""

from cifarflow.config import with_defaults
from cifarflow.controller.pack_plan import build_packs, describe_fusion, fuse_mode
from cifarflow.controller.plan import build_runs


def runs_of(sweep: dict, **train):
    return build_runs(with_defaults({"strategies": ["cpu", "gpu"], "train": train,
                                     "sweep": sweep}))


def test_fused_packs_share_model_and_batch_size():
    runs = runs_of({"lr": [0.01, 0.02, 0.03], "batch_size": [128, 256],
                    "model": ["lenet", "resnet18"]}, augment={"flip": False, "crop": 0})
    packs = build_packs(runs, 4, fuse="auto")
    assert sum(len(p.members) for p in packs.values()) == 24  # 12 runs of each strategy
    for pack in packs.values():
        assert pack.fuse == "auto"
        shapes = {(runs[m].strategy, runs[m].config.model, runs[m].config.batch_size)
                  for m in pack.members}
        assert len(shapes) == 1, pack
    # 2 strategies x 2 models x 2 batch sizes, 3 runs each: one pack of 3 per shape
    assert sorted(len(p.members) for p in packs.values()) == [3] * 8
    line = describe_fusion(runs, packs)
    assert line.startswith("pack.fuse: 24 runs in 8 fused pack(s) (lenet bs 128: 2;")
    assert "fuse apart" in line


def test_unfused_packs_ignore_the_model_as_before():
    runs = runs_of({"lr": [0.01, 0.02], "model": ["lenet", "resnet18"]})
    packs = build_packs(runs, 4)
    assert [len(p.members) for p in packs.values()] == [4, 4]
    assert not any(p.fuse for p in packs.values())


def test_runs_that_cannot_fuse_go_to_plain_packs_and_the_line_says_so():
    runs = runs_of({"lr": [0.01, 0.02], "loader": ["tensor", "torchvision"]})
    packs = build_packs(runs, 8, fuse="vmap")
    kinds = sorted((p.fuse, len(p.members)) for p in packs.values())
    assert kinds == [("", 2), ("", 2), ("vmap", 2), ("vmap", 2)]
    assert "4 run(s) that cannot fuse (loader torchvision) in 2 plain pack(s)" in \
        describe_fusion(runs, packs)


def test_runs_fuse_apart_by_augmentation_smoothing_and_tta():
    """A fused group's batches, loss and evaluation are one for all its members: resnet18
    (flip + crop 4 by default) and lenet fuse apart, and so do runs with another label
    smoothing or test-time flip; all of them fuse."""
    runs = runs_of({"lr": [0.01, 0.02], "model": ["lenet", "resnet18"]})
    packs = build_packs(runs, 8, fuse="auto")
    assert all(p.fuse for p in packs.values())
    assert sorted(len({runs[m].config.model for m in p.members}) for p in packs.values()) \
        == [1, 1, 1, 1]  # 2 strategies x 2 models
    assert {repr(runs[m].config.augment) for m in runs if runs[m].config.model == "resnet18"} \
        == {repr({"flip": True, "crop": 4})}
    for kw in ({"label_smoothing": 0.1}, {"augment": {"flip": True}}):
        runs = {**runs_of({"lr": [0.01, 0.02]}), **runs_of({"lr": [0.03, 0.04]}, **kw)}
        packs = build_packs(runs, 8, fuse="auto")
        assert sorted(len(p.members) for p in packs.values() if p.fuse) == [2, 2, 2, 2], kw


def test_fuse_setting():
    assert [fuse_mode(v) for v in (False, True, "vmap", "loop", None)] == \
        ["", "auto", "vmap", "loop", ""]


def test_runs_of_other_amp_settings_fuse_apart():
    """train.amp is one autocast for a fused step (its strategy's): a bf16 run and a float32
    run never share a fused model (pack_plan.FUSE_KEYS)."""
    runs = {**runs_of({"lr": [0.01, 0.02]}, amp="none"),
            **runs_of({"lr": [0.03, 0.04]}, amp="bf16")}
    packs = build_packs(runs, 8, fuse="auto")
    assert sorted(len(p.members) for p in packs.values()) == [2, 2, 2, 2]
    for pack in packs.values():
        assert len({runs[m].config.amp for m in pack.members}) == 1, pack
