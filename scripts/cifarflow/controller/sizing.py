"""What a segment's job asks for: the run's configured request, or, with
``resources.autosize``, one derived from the previous segment's measurement (a margin
above its peak memory and its wall time per epoch; never above the configured request),
and more memory after a try of this segment ran out of it (``resources.oom_factor`` per
such try, up to ``resources.max_mem_mb``). Called by the workflow's resource functions,
whose input is the previous segment. No torch."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..config import budget_for
from ..jobfacts import ENV_BUILD_SHARE

MIN_MEM_MB = 256  # below this the Python interpreter and torch do not start


@dataclass(frozen=True)
class Measured:
    peak_node_mb: float  # the busiest node's peak (all its ranks together)
    wall_s: float        # all tries of the segment
    epochs: int          # epochs the segment advanced
    end_epoch: int       # epochs done when it ended
    env_build_s: float = 0.0  # its job venv's longest build (env.mode slurm_tmpdir)

    @classmethod
    def of_segment(cls, segment_dir) -> "Measured | None":
        """From the segment's manifest (its tries' usage), None where it has none."""
        try:
            meta = json.loads((Path(segment_dir) / "checkpoint.json").read_text())
        except (OSError, ValueError):
            return None
        history = meta.get("segment_runs", [])
        name = Path(segment_dir).name
        mine = [i for i, t in enumerate(history) if t.get("segment") == name]
        peaks = [max((t.get("peak_rss_mb_per_node") or {"": t.get("peak_rss_mb", 0)}).values())
                 for t in (history[i] for i in mine)]
        if not mine or not any(peaks):
            return None
        before = history[mine[0] - 1]["epoch"] if mine[0] else 0
        end = int(meta.get("epoch", 0))
        builds = [history[i].get("env_build_s") or 0.0 for i in mine]
        return cls(max(peaks), sum(history[i].get("wall_s", 0) for i in mine), end - int(before),
                   end, max(builds))


@dataclass(frozen=True)
class Request:
    mem_mb: int   # per node, as the job asks
    runtime: int  # minutes
    why: str      # one line for the log and the summary ("" = as configured)


def autosized(mem_mb: int, runtime: int, measured: Measured | None, next_epochs: int,
              margin: float, margin_s: float, min_runtime: int = 1) -> Request:
    """Segment k+1's request from segment k's measurement: memory a margin above the
    measured peak, runtime the measured time per epoch x the epochs to come x the margin,
    plus the engine's stop margin (config.budget_for: it stops at config.stop_after), never
    below ``min_runtime`` minutes (a job shorter than its start-up only feeds the queue), nor
    below the measured venv build over ENV_BUILD_SHARE (a job that builds its venv for 3
    minutes asks 30 or more). Never above the configured request."""
    if measured is None:
        return Request(mem_mb, runtime, "")
    mem = min(mem_mb, max(MIN_MEM_MB, 100 * math.ceil(measured.peak_node_mb * margin / 100)))
    why = [f"memory {mem} MB (peak {measured.peak_node_mb:.0f} MB x {margin:g})"]
    minutes = runtime
    if measured.epochs > 0 and next_epochs > 0:
        need_s = measured.wall_s / measured.epochs * next_epochs * margin
        need_min = math.ceil(budget_for(need_s, margin_s) / 60)
        build_min = math.ceil(measured.env_build_s / ENV_BUILD_SHARE / 60)
        minutes = min(runtime, max(1, min_runtime, need_min, build_min))
        floor = ""
        if need_min < minutes:
            floor = (f", raised so the job venv's build ({measured.env_build_s:.0f} s) stays "
                     f"under {ENV_BUILD_SHARE:.0%} of the job" if build_min > min_runtime else
                     ", raised to resources.autosize_min_runtime")
        why.append(f"runtime {minutes} min ({measured.wall_s / measured.epochs:.0f} s per "
                   f"epoch x {next_epochs} x {margin:g}, and the stop margin{floor})")
    return Request(mem, minutes, "autosize from the previous segment: " + ", ".join(why))


def after_out_of_memory(request: Request, out_of_memory_tries: int, factor: float,
                        max_mem_mb: int) -> Request:
    """The request of a retry after ``out_of_memory_tries`` tries of the segment were
    killed for memory: ``factor`` times more per such try, up to ``max_mem_mb``."""
    if not out_of_memory_tries:
        return request
    mem = min(max_mem_mb, math.ceil(request.mem_mb * factor ** out_of_memory_tries))
    note = (f"{out_of_memory_tries} tr{'y' if out_of_memory_tries == 1 else 'ies'} ran out of "
            f"memory: {mem} MB" + (" (resources.max_mem_mb)" if mem == max_mem_mb else ""))
    return Request(mem, request.runtime, "; ".join(filter(None, [request.why, note])))


def merged(measured: list) -> Measured | None:
    """Several members' measurements as one request must cover them: the largest peak, the
    slowest epoch and the longest venv build."""
    found = [m for m in measured if m is not None and m.epochs > 0]
    if not found:
        return None
    slowest = max(found, key=lambda m: m.wall_s / m.epochs)
    return Measured(max(m.peak_node_mb for m in found), slowest.wall_s, slowest.epochs,
                    min(m.end_epoch for m in found), max(m.env_build_s for m in found))


@dataclass(frozen=True)
class Policy:
    """A run's request rules (config.resources, per node where the job holds several of
    its processes)."""
    mem_mb: int
    runtime: int
    autosize: bool = False
    margin: float = 1.3
    oom_factor: float = 2.0
    max_mem_mb: int = 0
    margin_s: float = 60.0
    min_runtime: int = 10  # minutes: autosize asks for no less

    def request(self, previous: list, until_epoch: int, out_of_memory_tries: int) -> Request:
        """The request of a segment that trains up to ``until_epoch``; ``previous``: the
        segment directories its measurement comes from (none for segment 1)."""
        measured = merged([Measured.of_segment(d) for d in previous]) if self.autosize else None
        next_epochs = until_epoch - measured.end_epoch if measured else 0
        request = autosized(self.mem_mb, self.runtime, measured, next_epochs, self.margin,
                            self.margin_s, self.min_runtime)
        return after_out_of_memory(request, out_of_memory_tries, self.oom_factor,
                                   max(self.max_mem_mb, self.mem_mb))
