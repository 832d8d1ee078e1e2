"""Requests that learn: segment k+1 sized from segment k, more memory after an out-of-memory
try, no retry after an error to fix (pure functions over a segment's manifest and the run's
tries.jsonl)."""

import json

import pytest

from cifarflow.job import tries
from cifarflow.config import budget_for, stop_after
from cifarflow.controller.sizing import Measured, Policy, Request, after_out_of_memory, autosized


def write_segment(root, k, epoch, history):
    d = root / f"segment-{k}"
    d.mkdir(parents=True)
    (d / "checkpoint.json").write_text(json.dumps({"epoch": epoch, "segment_runs": history}))
    return d


def try_of(k, wall_s, peak_per_node, epoch):
    return {"segment": f"segment-{k}", "wall_s": wall_s, "epoch": epoch,
            "peak_rss_mb": sum(peak_per_node.values()), "peak_rss_mb_per_node": peak_per_node}


def test_the_measurement_of_a_segment_is_its_busiest_node_and_all_its_tries(tmp_path):
    history = [try_of(1, 50, {"a": 900}, 2),                       # segment 1: epochs 1-2
               try_of(2, 30, {"a": 400, "b": 700}, 3),             # segment 2, killed at 3
               try_of(2, 60, {"a": 500, "b": 650}, 4)]             # its retry, epoch 4
    m = Measured.of_segment(write_segment(tmp_path, 2, 4, history))
    assert m == Measured(peak_node_mb=700, wall_s=90, epochs=2, end_epoch=4)
    assert Measured.of_segment(tmp_path / "segment-9") is None


def test_autosize_asks_a_margin_above_the_measurement_never_above_the_config():
    m = Measured(peak_node_mb=610, wall_s=120, epochs=2, end_epoch=2)
    r = autosized(4000, 30, m, next_epochs=2, margin=1.3, margin_s=60)
    assert r.mem_mb == 800                     # 610 x 1.3 = 793, rounded up to 100 MB
    # 60 s per epoch x 2 x 1.3 = 156 s of training; the engine stops at runtime - 60 s:
    # 216 s, so 4 minutes (min_runtime 1: no floor here)
    assert r.runtime == 4
    assert "peak 610 MB x 1.3" in r.why and "60 s per epoch x 2" in r.why
    big = Measured(peak_node_mb=5000, wall_s=3000, epochs=1, end_epoch=1)
    assert (autosized(4000, 30, big, 1, 1.3, 60).mem_mb,
            autosized(4000, 30, big, 1, 1.3, 60).runtime) == (4000, 30)
    assert autosized(4000, 30, None, 2, 1.3, 60) == Request(4000, 30, "")


@pytest.mark.parametrize("train_s, margin_s, budget_s", [
    (156, 60, 216), (400, 60, 460), (240, 60, 300), (0, 60, 60), (100, 0, 100)])
def test_the_request_and_the_engines_stop_follow_one_rule(train_s, margin_s, budget_s):
    """A budget autosize asks for lets the engine train exactly as long as it needs: the
    stop (the budget less the margin) is met exactly."""
    assert budget_for(train_s, margin_s) == pytest.approx(budget_s)
    assert stop_after(budget_s, margin_s) == pytest.approx(train_s)
    assert stop_after(budget_s - 1, margin_s) < train_s or train_s == 0  # never below 0


def test_autosize_asks_no_fewer_minutes_than_its_floor():
    """A fast run would ask for 1-2 minute segments; the floor (resources.autosize_min_runtime)
    keeps jobs longer than their start-up, never above the configured runtime."""
    fast = Measured(peak_node_mb=610, wall_s=10, epochs=2, end_epoch=2)
    assert autosized(4000, 30, fast, 2, 1.3, 60).runtime == 2  # no floor: 2 minutes
    floored = autosized(4000, 30, fast, 2, 1.3, 60, min_runtime=10)
    assert floored.runtime == 10 and "raised to resources.autosize_min_runtime" in floored.why
    assert autosized(4000, 5, fast, 2, 1.3, 60, min_runtime=10).runtime == 5  # the config's
    slow = Measured(peak_node_mb=610, wall_s=1200, epochs=2, end_epoch=2)
    assert autosized(4000, 60, slow, 2, 1.3, 60, min_runtime=10).runtime == 27  # above it


def test_autosize_keeps_the_job_venv_build_under_a_tenth_of_the_job(tmp_path):
    """env.mode slurm_tmpdir: a segment whose job built its venv for 150 s makes the next one
    ask at least 10 x that (25 min), above autosize_min_runtime, never above the config."""
    built = [{**try_of(1, 60, {"a": 600}, 2), "env_build_s": 150.0}]
    m = Measured.of_segment(write_segment(tmp_path, 1, 2, built))
    assert m.env_build_s == 150
    r = autosized(4000, 60, m, 2, 1.3, 60, min_runtime=10)
    assert r.runtime == 25 and "the job venv's build (150 s) stays under 10% of the job" in r.why
    assert autosized(4000, 20, m, 2, 1.3, 60, min_runtime=10).runtime == 20  # the config's
    quick = Measured(peak_node_mb=600, wall_s=60, epochs=2, end_epoch=2, env_build_s=30)
    assert autosized(4000, 60, quick, 2, 1.3, 60, min_runtime=10).runtime == 10  # 5 < 10
    packed = Policy(4000, 60, autosize=True, min_runtime=10).request(
        [write_segment(tmp_path / "b", 1, 2, [try_of(1, 60, {"a": 600}, 2)]),
         tmp_path / "segment-1"], 3, 0)
    assert packed.runtime == 25  # a pack: its slowest member's build


def test_an_out_of_memory_retry_asks_more_up_to_the_cap():
    base = autosized(1000, 10, None, 1, 1.3, 60)
    assert after_out_of_memory(base, 0, 2, 8000) is base
    assert after_out_of_memory(base, 1, 2, 8000).mem_mb == 2000
    capped = after_out_of_memory(base, 4, 2, 8000)
    assert capped.mem_mb == 8000 and "resources.max_mem_mb" in capped.why


def test_a_policy_sizes_a_pack_by_its_largest_member(tmp_path):
    a = write_segment(tmp_path / "a", 1, 1, [try_of(1, 40, {"n": 300}, 1)])
    b = write_segment(tmp_path / "b", 1, 1, [try_of(1, 90, {"n": 900}, 1)])
    policy = Policy(mem_mb=4000, runtime=30, autosize=True, margin=1.5, max_mem_mb=16000,
                    min_runtime=1)
    r = policy.request([a, b], until_epoch=2, out_of_memory_tries=0)
    assert r.mem_mb == 1400 and r.runtime == 4  # 900 x 1.5; 90 s x 1.5 = 135 s: 195 s
    off = Policy(mem_mb=4000, runtime=30, max_mem_mb=16000)
    assert off.request([a, b], 2, 0).mem_mb == 4000
    assert off.request([a, b], 2, 1).mem_mb == 8000


@pytest.fixture
def invocation(monkeypatch):
    monkeypatch.setenv(tries.INVOCATION, "now")
    for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "SLURM_JOB_ID", "CIFARFLOW_SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)


def test_tries_end_as_recorded_else_as_slurm_says(tmp_path, invocation, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    tries.record(tmp_path, 1, 1, "start")
    tries.record(tmp_path, 1, 1, "end", ended="completed")
    tries.record(tmp_path, 2, 1, "start")                      # killed: no end
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    tries.record(tmp_path, 2, 2, "start")
    states = {"41": "OUT_OF_MEMORY", "42": "NODE_FAIL"}
    asked = []
    got = tries.tries_of(tmp_path, 2, states_of=lambda jobs: asked.append(jobs) or states)
    assert [t["ended"] for t in got] == ["out of memory", "node failure"]
    assert asked == [["41", "42"]]  # one question for every try without an end
    assert tries.out_of_memory_count(tmp_path, 2, states_of=lambda jobs: states) == 1
    assert tries.tries_of(tmp_path, 2, states_of=lambda jobs: {})[0]["ended"] == "killed"
    # another invocation's tries are not this one's
    assert tries.tries_of(tmp_path, 2, invocation="later", states_of=lambda jobs: states) == []


def test_a_retry_after_an_error_to_fix_is_refused_once_any_rank_reported_it(tmp_path, invocation,
                                                                           monkeypatch):
    tries.record(tmp_path, 3, 1, "start")
    monkeypatch.setenv("RANK", "1")
    tries.record(tmp_path, 3, 1, "end", ended=tries.USER_ERROR, error="ValueError: bad")
    monkeypatch.setenv("RANK", "0")
    tries.record(tmp_path, 3, 1, "end", ended="failed", error="RuntimeError: peer closed")
    assert tries.refusal(tmp_path, 3, attempt=1) is None     # a first try always trains
    why = tries.refusal(tmp_path, 3, attempt=2)
    assert "attempt 1 failed with an error to fix" in why and "ValueError: bad" in why
    assert tries.refusal(tmp_path, 2, attempt=2) is None     # another segment
    tries.record(tmp_path, 4, 1, "start")
    tries.record(tmp_path, 4, 1, "end", ended=tries.OUT_OF_MEMORY)
    assert tries.refusal(tmp_path, 4, attempt=2) is None     # memory: retried
    monkeypatch.setenv(tries.INVOCATION, "rerun")             # the user's next run trains
    assert tries.refusal(tmp_path, 3, attempt=2) is None


def test_a_try_slurm_killed_for_memory_is_known_by_its_log(tmp_path, invocation):
    """Where the job's state says FAILED (the step was killed, not the job), the try's own
    log holds Slurm's words."""
    tries.record(tmp_path, 1, 1, "start")
    tries.record(tmp_path, 1, 2, "start")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "segment-1.attempt1.log").write_text(
        "epoch 1\nslurmstepd-n1: error: StepId=15.0 exceeded memory limit (634183680 > "
        "419430400), being killed\nsrun: error: n1: task 0: Killed\n")
    (logs / "segment-1.attempt2.requeue1.log").write_text(
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=16.0.\n")
    (logs / "segment-1.attempt12.log").write_text("exceeded memory limit\n")  # not attempt 1
    got = tries.tries_of(tmp_path, 1, states_of=lambda jobs: {"": "FAILED"}, logs_dir=logs)
    assert [t["ended"] for t in got] == ["out of memory", "out of memory"]
    assert [t["ended"] for t in tries.tries_of(tmp_path, 1, states_of=lambda jobs: {})] == \
        ["killed", "killed"]
