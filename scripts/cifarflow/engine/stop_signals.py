"""SIGTERM/SIGUSR2 are recorded from a training process's first line on.

On preemption Slurm sends SIGTERM to every process of the step, then waits GraceTime
before SIGKILL. The training rule's shell and its log ``tee`` ignore SIGTERM, so the
segment alone reacts: it stops at the next batch boundary and checkpoints. A signal that
arrives while torch still imports or the data loads is kept here, not lost."""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
received: str | None = None


def _record(signum, frame) -> None:
    global received
    received = signal.Signals(signum).name


def listen() -> None:
    """(Re)install the handlers: Lightning installs its own SIGTERM handler in fit()."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)
