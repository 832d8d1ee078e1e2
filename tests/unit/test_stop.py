"""The segment's own budget in-process: where StopController puts the deadline (its rule
runtime, the spec's budget_s, the Slurm job's end) and when it says stop."""

import time

import pytest

from cifarflow.engine import stop


class OneProcess:
    """The strategy side StopController reads: one rank, nothing to all-reduce."""
    rank, world_size, is_main = 0, 1, True


@pytest.fixture(autouse=True)
def no_slurm_job(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_JOB_END_TIME", "CIFARFLOW_SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("budget_s, margin_s, stops_after_s", [
    (1000, 60, 940),
    (1000, 300, 700),
    (1000, 0, 1000),   # the engine still stops before a batch and its save end past T
    (86400, 60, 86340),  # a 24 h request trains 23 h 59 min, not 19.2 h (0.8 T before)
    (30, 60, 0),
])
def test_the_deadline_is_the_budget_less_the_margin(budget_s, margin_s, stops_after_s):
    start = time.time()
    controller = stop.StopController(budget_s, margin_s, OneProcess(), start, interval_s=1e9)
    assert controller.deadline == pytest.approx(start + stops_after_s)


def test_it_stops_when_the_next_batch_would_end_past_the_deadline():
    start = time.time() - 840  # 100 s before the deadline of a 1000 s budget (at 940 s)
    controller = stop.StopController(1000, 60, OneProcess(), start, interval_s=1e9)
    assert controller.decide(next_step_s=50, may_save=True) == (None, False)
    assert controller.decide(next_step_s=150, may_save=True) == ("time budget", False)


def test_the_slurm_job_end_is_a_budget_too_and_the_earlier_deadline_wins(monkeypatch):
    start = time.time()
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(start) + 500))
    assert stop.slurm_end_time() == int(start) + 500
    remaining = int(start) + 500 - start
    controller = stop.StopController(1000, 60, OneProcess(), start, interval_s=1e9)
    assert controller.deadline == pytest.approx(start + remaining - 60)
    controller = stop.StopController(100, 60, OneProcess(), start, interval_s=1e9)
    assert controller.deadline == pytest.approx(start + 40)  # the spec's budget is earlier
    monkeypatch.delenv("SLURM_JOB_END_TIME")
    assert stop.slurm_end_time() is None  # no job: no end
    assert stop.StopController(0, 60, OneProcess(), start, 1e9).deadline == float("inf")


def test_saves_follow_the_interval():
    controller = stop.StopController(0, 60, OneProcess(), time.time(), interval_s=3600)
    assert controller.decide(0.1, may_save=True) == (None, False)
    controller.last_save -= 3601
    assert controller.decide(0.1, may_save=True) == (None, True)
    assert controller.decide(0.1, may_save=False) == (None, False)  # no work dir


def test_every_training_subcommand_listens_for_stop_signals_before_torch():
    """A Slurm notice (SIGUSR2/SIGTERM) that comes while torch imports is not lost: cli.main
    starts listening first for each subcommand that trains (train-fused was missing)."""
    import argparse

    from cifarflow.cli import TRAINING_COMMANDS, parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(TRAINING_COMMANDS) == {name for name in sub.choices if name.startswith("train")}
