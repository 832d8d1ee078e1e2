"""How far a workflow's plan is, from what its runs published under results/: runs done,
segments done of planned, and the time left at the pace of this invocation.

Snakemake's own "N of M steps done" counts the jobs of a DAG that grows as segments
finish (each is a checkpoint) and pruning decides; this counts the plan's runs and
segments. The workflow's main process prints a line every `progress_s` seconds, from a
daemon thread (common.smk). No torch here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .chain import Chain
from ..engine.checkpoints.files import MANIFEST
from ..layout import RunPaths
from .pending import every
from ..results.show import duration


class NotPublished(Exception):
    """A segment the ranking of a pruning point needs is not published yet."""


@dataclass(frozen=True)
class Progress:
    runs: int
    runs_done: int
    segments: int
    segments_done: int
    epochs: int
    epochs_done: int
    at_most: bool  # pruning not decided yet: fewer segments may be trained

    def counts(self) -> tuple:
        return self.runs_done, self.segments_done, self.segments

    def line(self, left_s: float | None) -> str:
        text = (f"progress: {self.runs_done} of {self.runs} run{'s' if self.runs != 1 else ''} "
                f"done, {self.segments_done} of {'at most ' if self.at_most else ''}"
                f"{self.segments} segments")
        if self.runs_done == self.runs:
            return text
        if left_s is None:
            return f"{text}; time left: known once a segment finished"
        return f"{text}; about {duration(left_s)} left at the current pace"


class PlanProgress:
    """Reads the published segments of the plan's runs (plan.Run: segment_epochs, config);
    a manifest is read again only when it changed."""

    def __init__(self, results: str, runs: dict, prune: dict | None, max_segments: int):
        self.results, self.runs, self.max_segments = results, runs, max_segments
        self.chain = Chain(runs, {}, prune, max_segments, self.published, NotPublished)
        self.seen: dict[str, tuple] = {}  # manifest -> (its mtime, done, epoch)

    def published(self, run: str, k: int) -> str:
        segment = RunPaths(self.results, run).segment(k)
        if self.manifest(segment) is None:
            raise NotPublished(segment)
        return segment

    def manifest(self, segment: str) -> tuple | None:
        """(done, epoch) of a published segment, None where there is none (yet)."""
        path = Path(segment, MANIFEST)
        try:
            stamp = path.stat().st_mtime_ns
            if self.seen.get(str(path), (None,))[0] != stamp:
                meta = json.loads(path.read_text())
                self.seen[str(path)] = (stamp, bool(meta["done"]), int(meta["epoch"]))
        except (OSError, ValueError, KeyError):  # absent, or being replaced right now
            return None
        return self.seen[str(path)][1:]

    def undecided(self, name: str) -> bool:
        """Whether a pruning point of the run's plan has still to rank it."""
        run = self.runs[name]
        for point in (p for p in self.chain.points if p < len(run.segment_epochs)):
            try:
                if name not in self.chain.alive_after(self.chain.group(name), point):
                    return False  # cut there
            except NotPublished:
                return True
        return False

    def read(self) -> Progress:
        runs_done = segments = segments_done = epochs = epochs_done = 0
        at_most = False
        for name, run in self.runs.items():
            published = []  # (done, epoch) of segments 1, 2, ...: a chain has no gaps
            while len(published) < self.max_segments:
                found = self.manifest(RunPaths(self.results, name).segment(len(published) + 1))
                if found is None:
                    break
                published.append(found)
            cut = self.chain.known_pruned_at(name) if self.chain.points else None
            at_most = at_most or self.undecided(name)
            planned = cut or len(run.segment_epochs)
            target = run.until_epoch(cut) if cut else run.config.epochs
            done = len(published) >= planned and (cut is not None or published[-1][0])
            if not done and len(published) >= planned:  # stopped early: one more segment
                planned = len(published) + 1
            runs_done += done
            segments += planned
            segments_done += min(len(published), planned)
            epochs += target
            trained = max((epoch for _, epoch in published), default=0)
            epochs_done += target if done or any(d for d, _ in published) else min(trained, target)
        return Progress(len(self.runs), runs_done, segments, segments_done, epochs, epochs_done,
                        at_most)


class ProgressWatch:
    """Says a progress line through `say` at each look (every `interval_s` s) where the
    counts changed; the first look notes what this invocation found published (in the
    watching thread: planning never waits on reading manifests), the next ones speak.
    The time left: the epochs left at the pace (epochs per second) since the first look."""

    def __init__(self, plan: PlanProgress, say: Callable[[str], None], interval_s: float = 60,
                 active: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic):
        self.plan, self.say, self.interval_s, self.active = plan, say, interval_s, active
        self.clock = clock
        self.start_s, self.start = 0.0, None
        self.said: tuple | None = None

    def time_left(self, now: Progress) -> float | None:
        trained = now.epochs_done - self.start.epochs_done
        if trained <= 0:
            return None
        return (now.epochs - now.epochs_done) * (self.clock() - self.start_s) / trained

    def look(self) -> str | None:
        if self.start is None:
            self.start_s, self.start = self.clock(), self.plan.read()
            return None
        now = self.plan.read()
        if now.counts() == self.said or (self.said is None and now.runs_done == now.runs):
            return None
        self.said = now.counts()
        line = now.line(self.time_left(now))
        self.say(line)
        return line

    def start_watching(self) -> "ProgressWatch":
        if self.interval_s > 0:
            every(self.interval_s, self.look, self.active, "cifarflow-progress", at_once=True)
        return self


def watch_progress(results: str, plan: Chain, say: Callable[[str], None], interval_s: float,
                   active: Callable[[], bool]) -> ProgressWatch:
    """The workflow's progress lines (common.smk): the runs, pruning and segment limit of
    its chain, walked on the files alone (never through Snakemake's checkpoints)."""
    progress = PlanProgress(results, plan.runs, plan.prune, plan.max_segments)
    return ProgressWatch(progress, say, interval_s, active).start_watching()
