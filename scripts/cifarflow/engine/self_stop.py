"""For tests only: a training process that stops itself (SIGSTOP) at a named point, so a
test's victim is frozen there from the start, on any machine, instead of being found by
polling while it trains on.

``CIFARFLOW_TEST_STOP_AT=<point>[@<part of the segment's path>]``, the point one of:

* ``before-first-batch``: once the segment has resumed and its clock started;
* ``save:<k>``: right after its k-th in-segment checkpoint (the work dir) is whole.

``CIFARFLOW_TEST_STOPPED=<file>``: only the first process to get there stops, and it writes
its pid into that file first (created atomically: the test reads the pid from it). Unset,
the variables cost one dictionary lookup per point."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

STOP_AT = "CIFARFLOW_TEST_STOP_AT"
STOPPED = "CIFARFLOW_TEST_STOPPED"
BEFORE_FIRST_BATCH = "before-first-batch"
_saves: Counter = Counter()  # in-segment saves of each segment in this process


def stop_at(point: str, segment, environ=os.environ) -> bool:
    """SIGSTOP this process if CIFARFLOW_TEST_STOP_AT names ``point`` of ``segment`` (its
    out path); whether it stopped (and was continued since)."""
    wanted = environ.get(STOP_AT)
    if not wanted:
        return False
    name, _, where = wanted.partition("@")
    if name != point or where not in str(segment):
        return False
    marker = environ.get(STOPPED)
    if marker and not claim(Path(marker)):
        return False  # another process stopped there already
    print(f"[test] {STOP_AT}={wanted}: process {os.getpid()} stops itself at {point} of "
          f"{segment}", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    return True


def claim(marker: Path) -> bool:
    """Create ``marker`` holding this pid, whole or not at all; False if it exists."""
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}")
    tmp.write_text(f"{os.getpid()}\n")
    try:
        os.link(tmp, marker)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    return True


def saved(segment, environ=os.environ) -> None:
    """After an in-segment save of ``segment``: the ``save:<k>`` point."""
    if environ.get(STOP_AT):
        _saves[str(segment)] += 1
        stop_at(f"save:{_saves[str(segment)]}", segment, environ)
