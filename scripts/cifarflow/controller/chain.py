"""The chains of segments, as the workflow walks them: which segment of a run is its last,
where successive halving cuts it, and which members a pack's segment job trains.

Segments are Snakemake checkpoints, so what lies past one is known only once it ran:
``segment_of(run, k)`` returns the directory of a run's segment k once the job that trains
it ran and raises (Snakemake's IncompleteCheckpointException, given as ``pending``) until
then, which makes Snakemake schedule that job and walk again afterwards. No torch here.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

from ..engine.checkpoints.files import read_manifest, read_metrics
from .prune import prune_mode, survivors


class Chain:
    def __init__(self, runs: dict, packs: dict, prune: dict | None, max_segments: int,
                 segment_of: Callable[[str, int], str], pending: type[Exception]):
        self.runs, self.packs, self.prune = runs, packs, prune
        self.max_segments, self.segment_of, self.pending = max_segments, segment_of, pending
        self.pack_of = {m: p.name for p in packs.values() for m in p.members}
        self.points = sorted(prune["at_segments"]) if prune else []
        self.alive_after = functools.cache(self._alive_after)  # fixed once computable

    def group(self, run: str) -> tuple:
        """The runs ranked together at a pruning point: a strategy's (a search's: of one
        round, whose trials train together)."""
        return self.runs[run].strategy, self.runs[run].round

    def runs_of(self, group: tuple) -> list[str]:
        return [name for name in self.runs if self.group(name) == group]

    def add_packs(self, packs: dict, replace: set) -> None:
        """A search round's packs, once its trials are known (replacing the provisional ones
        of its placeholders, ``replace``)."""
        for name in replace:
            del self.packs[name]
        self.packs.update(packs)
        self.pack_of = {m: p.name for p in self.packs.values() for m in p.members}

    def last_epoch(self, segment: str, metric: str):
        history = read_metrics(Path(segment))
        return history[-1].get(metric) if history else None

    def _alive_after(self, group: tuple, point: int) -> tuple:
        """Runs of a group (a strategy, or a search round of one) that go on after segment
        `point`: successive halving at each pruning point up to it, a barrier across the
        runs still alive there."""
        alive = self.runs_of(group)
        for p in (k for k in self.points if k <= point):
            metric = self.prune["metric"]
            scores = {run: self.last_epoch(self.segment_of(run, p), metric) for run in alive}
            alive = survivors(scores, prune_mode(self.prune), self.prune["keep"],
                              self.prune["min_runs"])
        return tuple(alive)

    def pruned_at(self, run: str) -> int | None:
        """The segment after which the run was pruned, or None."""
        for point in self.points:
            self.segment_of(run, point)  # its own first, so all alive runs train it at once
            if run not in self.alive_after(self.group(run), point):
                return point
        return None

    def known_pruned_at(self, run: str) -> int | None:
        """pruned_at, or None while the ranking is not known yet (partial summaries)."""
        try:
            return self.pruned_at(run)
        except self.pending:
            return None

    def final_segment(self, run: str) -> str:
        """Walk the chain: up to each pruning point (where the run may stop), then the
        planned last segment, plus extra ones while a segment stopped early (time budget
        or signal). The DAG grows only when needed."""
        cut = self.pruned_at(run)
        if cut is not None:
            return self.segment_of(run, cut)
        k = len(self.runs[run].segment_epochs)
        while True:
            out = self.segment_of(run, k)
            if read_manifest(Path(out), verify=False)["done"]:
                return out
            if k >= self.max_segments:
                raise ValueError(f"run {run}: not finished after {k} segments; raise "
                                 "resources.runtime or segments.max_extra")
            k += 1

    def trains(self, run: str, k: int) -> bool:
        """Whether segment k of the run is trained: not after the run was pruned, and past
        the planned segments only while the one before stopped early. Asked of a pack's
        segment once the DAG holds it, when what it needs to know has run."""
        if any(p < k and run not in self.alive_after(self.group(run), p)
               for p in self.points):
            return False
        if k <= len(self.runs[run].segment_epochs):
            return True
        return self.trains(run, k - 1) and not read_manifest(
            Path(self.segment_of(run, k - 1)), verify=False)["done"]

    def members(self, pack: str, k: int) -> list[str]:
        """The runs of a pack that its segment-k job trains."""
        return [run for run in self.packs[pack].members if self.trains(run, k)]
