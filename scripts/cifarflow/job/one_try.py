"""One try of a segment, from its start to its end, the same for every kind of job (a run's
segment, a pack's member, a fused group's member): a retry of an error to fix is refused,
an earlier workflow's try still training the run is taken over (or this one is the stale
one), the start is recorded in the run's tries.jsonl, and how the try ended: completed or
stopped early, an error to fix, out of memory (a MemoryError, or torch's OutOfMemoryError on
a GPU), or failed. Only rank 0 takes over and records; every rank trains. No torch here.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..layout import segment_number
from . import tries
from .takeover import Superseded, take_over


class TryRefused(Exception):
    """This try must not train: a retry of an error to fix (exit status 2), or a newer run
    of the workflow trains the run (3). The message is the one line to say."""

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status

    def line(self, command: str) -> str:
        """What ``cifarflow <command>`` says of it."""
        return f"cifarflow {command}: {'error: ' if self.exit_status == 2 else ''}{self}"


@dataclass
class Outcome:
    """What the try's body tells its end: the segment's result (its ``stopped`` reason), or
    the error a member of a fused group ended with (an error to fix)."""

    result: dict | None = None
    error: str | None = None
    fields: dict = field(default_factory=dict)


def user_error_types() -> tuple:
    """The errors a user must fix (exit status 2): a config, data, checkpoint or strategy
    error. Imported when a try fails: torch is loaded by then."""
    from ..data import DatasetError
    from ..engine.checkpoints.files import CheckpointError
    from ..engine.strategies.base import StrategyError

    return DatasetError, CheckpointError, StrategyError, ValueError


def ended_by(exc: BaseException) -> str:
    """How a try that raised ``exc`` is recorded."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return tries.OUT_OF_MEMORY
    return tries.USER_ERROR if isinstance(exc, user_error_types()) else "failed"


@contextlib.contextmanager
def recorded_try(run_dir: Path, out, attempt: int, say: Callable[[str], None] | None = None,
                 **start_fields):
    """The try of the segment written to ``out`` (results/runs/<run>/segment-<k>), around
    its training (the ``with`` body, which fills the Outcome it is given). Raises
    TryRefused before the body where the try must not train."""
    say = say or (lambda line: print(line, flush=True))
    run_dir, k = Path(run_dir), segment_number(out) or 0
    refused = tries.refusal(run_dir, k, attempt)
    if refused:
        raise TryRefused(refused, 2)
    main = tries.this_rank() == 0
    if main:
        try:  # never two tries training one run: an earlier workflow's job may live on
            take_over(run_dir, run_dir.name, say=say)
        except Superseded as exc:
            raise TryRefused(str(exc), 3) from None
        tries.record(run_dir, k, attempt, "start", **start_fields)
    outcome = Outcome()
    try:
        yield outcome
    except BaseException as exc:
        if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            ended = ended_by(exc)  # an error to fix is kept whole: a retry says it again
            text = str(exc) if ended == tries.USER_ERROR else str(exc)[:300]
            tries.record(run_dir, k, attempt, "end", ended=ended,
                         error=f"{type(exc).__name__}: {text}")
        raise
    if outcome.error is not None:
        tries.record(run_dir, k, attempt, "end", ended=tries.USER_ERROR, error=outcome.error)
    elif main and outcome.result is not None:
        from ..engine.usage import ended_as

        tries.record(run_dir, k, attempt, "end", ended=ended_as(outcome.result["stopped"]))


def refused_exit(command: str, exc: TryRefused) -> None:
    """A single try's refusal as its process ends: the line on stderr, its exit status."""
    print(exc.line(command), file=sys.stderr, flush=True)
    sys.exit(exc.exit_status)


def train_segment(order, start_time: float) -> dict:
    """`cifarflow train`: segment ``order`` (orders.SegmentOrder) of a run, its try recorded
    in the run's tries.jsonl; torch is imported once the start is recorded, so a kill that
    comes early finds it. A segment outside a workflow (no run folder) records no try."""
    if not order.work:
        from ..engine.run import run_training

        return run_training(order, start_time)
    try:
        with recorded_try(order.run_dir, order.out, order.attempt) as outcome:
            from ..engine.run import run_training

            outcome.result = run_training(order, start_time)
    except TryRefused as exc:
        refused_exit("train", exc)
    return outcome.result
