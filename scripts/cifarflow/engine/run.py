"""The engine's one way in: an order, trained. ``run_training`` takes a run's segment
(orders.SegmentOrder), ``run_fused`` a fused pack's (orders.FusedOrder); each builds its
runs' ledgers (engine/segment.py) and hands them to the one loop (engine/loop.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import TrainConfig
from ..orders import FusedOrder, SegmentOrder
from .segment import Segment


def run_training(order: SegmentOrder, start_time: float | None = None) -> dict:
    """Thin entry point: set the strategy up, let it drive a segment, always tear down."""
    from .strategies import get_strategy

    cfg = TrainConfig.read(Path(order.spec))
    strategy = get_strategy(cfg.strategy)(cfg, order.threads)
    try:
        strategy.setup()
        return strategy.train(Segment(cfg, strategy, order, start_time))
    finally:
        strategy.teardown()
        sys.stdout.flush()


def run_fused(order: FusedOrder, logs: dict, start_time: float, say) -> dict:
    """Segment k of a fused pack's members: ``logs`` maps each member whose try began to
    (its attempt, the stream its lines go to); the first samples the GPU for all. Each
    run's result, or its error."""
    from .fused.train import train_members
    from .strategies import get_strategy

    members = []
    for run, (attempt, stream) in logs.items():
        member = order.member(run, attempt)
        cfg = TrainConfig.read(Path(member.spec))
        members.append(Segment(cfg, get_strategy(cfg.strategy)(cfg, order.threads), member,
                               start_time, stream, sample_gpu=not members))
    return train_members(order, members, say)
