"""What a fused step costs, counted rather than timed (issue 35): the operators it dispatches
(torch profiler) do not grow with the number of members K in vmap fusion and stay close to a
single run's step, and the group holds one copy of the data whatever K. Timings are
bench/fused_cpu.py's; a test never asserts a speed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import SYNTHETIC
from cifarflow.config import with_defaults
from cifarflow.controller.plan import build_runs
from cifarflow.engine.fused.train import fused_group
from cifarflow.engine.segment import Segment
from cifarflow.engine.step import PlainStep
from cifarflow.orders import SegmentOrder
from cifarflow.engine.strategies import get_strategy

# aten operators that launch no kernel: views, metadata, allocation; the rest compute
NO_KERNEL = {f"aten::{name}" for name in """alias as_strided as_strided_ contiguous detach
empty empty_like empty_strided expand flatten lift_fresh movedim new_empty new_empty_strided
permute reshape _reshape_alias resize_ resolve_conj resolve_neg select slice squeeze t to
transpose unflatten unsqueeze _unsafe_view view""".split()}


def configs(k: int, **train) -> list:
    """k lenet runs of one seed that differ in lr and weight decay, on cpu."""
    config = with_defaults({"strategies": ["cpu"], "data": {"synthetic": SYNTHETIC},
                            "train": {"epochs": 20, "batch_size": 100, **train},
                            "sweep": {"lr": [0.01 * (i + 1) for i in range(k)],
                                      "weight_decay": [0.0005]}})
    return [run.config for run in build_runs(config).values()]


def dispatched(step, x, y) -> dict[str, int]:
    """aten operators one call of ``step`` dispatches, by name (after a warm-up call)."""
    step(x, y)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step(x, y)
    return {e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")}


def computing(ops: dict[str, int]) -> int:
    return sum(n for name, n in ops.items() if name not in NO_KERNEL)


def fused_step_ops(k: int, cifar_dir: Path, mode: str = "vmap") -> dict[str, int]:
    group = fused_group(configs(k), cifar_dir, threads=2, mode=mode, say=lambda line: None)
    x, y = next(group.batches.epoch(0))
    return dispatched(group.train_step, x, y)


def single_step_ops(cifar_dir: Path) -> dict[str, int]:
    cfg = configs(1)[0]
    run = Segment(cfg, get_strategy("cpu")(cfg, 2),
                  SegmentOrder(spec="", data=str(cifar_dir), out="/nonexistent"))
    run.strategy.setup()
    run.build()
    x, y = next(run.batches.epoch(0))
    return dispatched(PlainStep(run).train_step, x, y)


def test_a_vmap_step_dispatches_as_many_operators_for_64_members_as_for_4(cifar_dir):
    """The fused step's operators (forward, loss, backward, optimizer, for all members): the
    same count for K = 4 and K = 64 (within 10 %), at most 1.5x one run's step. Before the
    flat buffers the optimizer alone was ~7 single-tensor operators per parameter tensor
    (10 in lenet), and the meter 2 per member: 2K more at K = 64."""
    four, sixty_four = fused_step_ops(4, cifar_dir), fused_step_ops(64, cifar_dir)
    single = single_step_ops(cifar_dir)
    assert computing(sixty_four) <= 1.1 * computing(four), (four, sixty_four)
    assert computing(four) <= 1.5 * computing(single), (four, single)
    # the whole-buffer optimizer: one zero_ of the flat gradients, one update per kind
    assert sixty_four.get("aten::addcmul_", 0) == 1  # p -= lr * d, all members at once


def test_loop_fusion_grows_with_members_and_vmap_does_not(cifar_dir):
    """The other side of the count: loop fusion calls the model once per member, so its
    operators grow with K (the CPU default trades that for oneDNN's plain convolutions)."""
    assert computing(fused_step_ops(8, cifar_dir, "loop")) > \
        3 * computing(fused_step_ops(2, cifar_dir, "loop"))


@pytest.mark.parametrize("k", [2, 16])
def test_a_fused_group_holds_one_copy_of_the_data(cifar_dir, k):
    """Every member's batches and test split read the same tensors (one copy on the
    device whatever K: on a GPU, 150 MB for CIFAR-10's training split instead of K x)."""
    group = fused_group(configs(k), cifar_dir, threads=2, mode="loop", say=lambda line: None)
    members = group.members
    assert len(members) == k
    assert len({m.batches.split.images.data_ptr() for m in members}) == 1
    assert len({m.test_split.images.data_ptr() for m in members}) == 1
    assert group.batches.split.images.data_ptr() == members[0].batches.split.images.data_ptr()
    assert group.batches.shared  # one seed: one gathered batch per step
    x, y = next(group.batches.epoch(0))
    assert x.shape[0] == y.shape[0] == 100  # (B, ...), not (K, B, ...)


@pytest.mark.slow  # torch.compile of the fused forward, backward and update: ~30 s on this CPU
def test_train_compile_compiles_the_fused_step(cifar_dir):
    """train.compile in a fused group: the forward with its loss (and so its backward) and
    the optimizer's update are compiled (each function's code holds a compiled entry), with
    no fallback said; the update reads its step's row of the hyper-parameter table, a view
    on the group's device; three steps end within float tolerance of the same group
    uncompiled (inductor fuses the arithmetic anew)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    from cifarflow.engine.fused.step import FusedStep
    from cifarflow.engine.fused.optim import FusedOptimizer

    counters.clear()
    said, weights = [], {}
    for compiled in (False, True):
        group = fused_group(configs(3, compile=compiled), cifar_dir, threads=2, mode="vmap",
                            say=said.append)
        start = group.fused.flat.clone()
        batches = group.batches.epoch(0)
        for _ in range(3):
            group.train_step(*next(batches))
        assert group.compiled is compiled
        weights[compiled] = group.fused.flat.clone()
        assert not torch.equal(weights[compiled], start)  # it trained
        for function in (FusedStep._forward_loss, FusedOptimizer.update):
            entries = _debug_get_cache_entry_list(function.__code__)  # dynamo's, per code
            assert bool(entries) is compiled, f"{function.__qualname__}: {len(entries)} " \
                f"compiled entries with train.compile {compiled}"
    assert counters["stats"]["unique_graphs"] >= 2, dict(counters["stats"])
    table = group.optimizer.table
    hyper, hyper64 = table.at(group.optimizer.step_index)
    assert hyper.device == hyper64.device == group.fused.flat.device
    assert hyper.untyped_storage().data_ptr() == table.rows.untyped_storage().data_ptr()
    assert hyper64.untyped_storage().data_ptr() == table.rows64.untyped_storage().data_ptr()
    assert not [line for line in said if "uncompiled" in line], said
    assert torch.allclose(weights[True], weights[False], rtol=1e-4, atol=1e-5)


def test_a_compiled_fused_segment_builds_one_forward_and_one_update_graph(cifar_dir,
                                                                          monkeypatch):
    """train.compile in a fused group of SGD and Adam members, over an epoch whose last
    batch is partial (2000 images, batch 300: 6 full batches and 200) and into the next:
    dynamo builds exactly two graphs, the forward with its loss (its backward through
    AOTAutograd) and the update, and never recompiles (the optimizer's state, the vmapped
    calls and the amp setting exist before the first step) nor breaks a graph; the partial
    batch runs uncompiled. The backend is aot_eager: dynamo's graphs are inductor's, without
    its ~30 s of code generation; the weights match the eager group's."""
    from torch._dynamo.utils import counters

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn: compile_(fn, backend="aot_eager"))
    adam = with_defaults({"strategies": ["cpu"], "data": {"synthetic": SYNTHETIC},
                          "train": {"epochs": 20, "batch_size": 300, "optimizer": "adam",
                                    "lr": 0.001}})
    weights, said = {}, []
    for compiled in (False, True):
        cfgs = configs(2, batch_size=300, momentum=0.9, compile=compiled) + [
            run.config for run in build_runs({**adam, "train": {**adam["train"],
                                                                "compile": compiled}}).values()]
        group = fused_group(cfgs, cifar_dir, threads=2, mode="vmap", say=said.append)
        counters.clear()
        sizes = []
        for epoch in (0, 1):
            for step, (x, y) in enumerate(group.batches.epoch(epoch)):
                group.train_step(x, y)
                sizes.append(y.shape[-1])
                if epoch == 1 and step == 1:
                    break
        assert group.compiled is compiled
        weights[compiled] = group.fused.flat.clone()
    assert sizes == [300] * 6 + [200] + [300] * 2
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not [line for line in said if "uncompiled" in line], said
    torch.testing.assert_close(weights[True], weights[False], rtol=1e-5, atol=1e-6)


def test_a_failing_compiled_update_falls_back_with_one_line(cifar_dir, monkeypatch):
    """A compiler that refuses the update (as one may refuse the forward): the group says so
    in one line and trains on uncompiled, the refused step included."""
    def refusing_compile(fn):
        if getattr(fn, "__name__", "") != "update":
            return fn

        def refused(*args):
            raise RuntimeError("the backend refused this graph\n(its details)")
        return refused

    monkeypatch.setattr(torch, "compile", refusing_compile)
    said = []
    group = fused_group(configs(2, compile=True), cifar_dir, threads=2, mode="vmap",
                        say=said.append)
    start, batches = group.fused.flat.clone(), group.batches.epoch(0)
    for _ in range(3):
        group.train_step(*next(batches))
    assert [line for line in said if "uncompiled" in line] == [
        "train.compile: the fused step runs uncompiled (RuntimeError: the backend refused "
        "this graph)"]
    assert group.compiled is False and group.optimizer.step_index == 3
    assert not torch.equal(group.fused.flat, start)
