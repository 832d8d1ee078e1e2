"""Successive halving between segments: ``sweep.prune``.

At each listed segment the runs of one strategy that are still alive are ranked on the
metric of the last epoch their segment trained; the best ``keep`` fraction (at least
``min_runs``) goes on, the others stop there. A run whose metric is missing or not a
number (a diverged run) counts as worst; ties are broken by run name, so the ranking is
the same every time it is computed."""

from __future__ import annotations

import math

METRICS = {"test_acc": "max", "train_acc": "max", "train_loss": "min"}  # and which way is best


def prune_mode(prune: dict) -> str:
    return prune.get("mode") or METRICS[prune["metric"]]


def check_prune(prune: dict | None, segments: int) -> None:
    """Plan-time refusals, each one line (ValueError)."""
    if not prune:
        return
    metric = prune["metric"]
    if metric not in METRICS:
        raise ValueError(f"sweep.prune.metric {metric!r} unknown; one of {sorted(METRICS)}")
    if not 0 < prune["keep"] < 1:
        raise ValueError(f"sweep.prune.keep {prune['keep']} must be between 0 and 1 (exclusive)")
    beyond = [k for k in prune["at_segments"] if not 1 <= k < segments]
    if beyond:
        raise ValueError(f"sweep.prune.at_segments {beyond}: a pruning point must be a segment "
                         f"followed by another, 1..{segments - 1} (segments.count is {segments})")


def survivors(metrics: dict[str, float | None], mode: str, keep: float,
              min_runs: int) -> list[str]:
    """The runs that go on, best first."""
    def badness(name):
        value = metrics[name]
        if value is None or math.isnan(value):
            return (1, 0.0, name)
        return (0, -value if mode == "max" else value, name)

    ranked = sorted(metrics, key=badness)
    n_keep = min(len(ranked), max(min_runs, math.ceil(len(ranked) * keep)))
    return ranked[:n_keep]
