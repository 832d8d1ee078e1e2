"""Used against requested, per run and in the advice (pure functions of recorded tries)."""

import pandas as pd
import pytest

from cifarflow.results.advice import bf16_advice, env_build_advice, request_advice
from cifarflow.results.table import used_vs_requested
from cifarflow.engine.usage import ended_as, segment_usage

RANKS = [{"host": "n1", "cpu_s": 50.0, "peak_rss_mb": 400.0},
         {"host": "n2", "cpu_s": 30.0, "peak_rss_mb": 300.0}]


def test_a_try_sums_its_ranks():
    used = segment_usage(RANKS, wall_s=100.0, threads=2, reason=None)
    assert used["cpu_s"] == 80 and used["cpus"] == 4
    assert used["cpu_efficiency"] == pytest.approx(80 / 400)
    assert used["peak_rss_mb"] == 700 and used["peak_rss_mb_per_node"] == {"n1": 400, "n2": 300}
    assert used["ended"] == "completed"
    assert ended_as("time budget") == "stopped early (time budget)"
    assert ended_as("signal SIGTERM").startswith("stopped early (signal SIGTERM: preempted")


def test_runs_and_advice_say_what_to_request_next_time():
    tries = [dict(segment_usage(RANKS[:1], 60.0, 4, None), queue_wait_s=12.0),
             dict(segment_usage(RANKS[:1], 120.0, 4, None), queue_wait_s=8.0)]
    res = {"cpus_per_task": 4, "mem_mb": 4000, "runtime": 30}
    row = used_vs_requested(tries, res)
    assert row["mem_used_mb"] == 400 and row["mem_requested_mb"] == 4000
    assert row["cpu_efficiency"] == pytest.approx(100 / (180 * 4))
    assert row["runtime_used_min"] == 2 and row["queue_wait_s"] == 10
    df = pd.DataFrame([{"strategy": "cpu", "cpus_per_task": 4, **row}])
    tips = request_advice(df)
    assert tips[0] == ("cpu (1 run(s)): used at most 400 MB of 4,000 MB requested: request "
                       "resources.mem_mb ~500 (saves ~0.2 GB-hours)")
    assert "busy 14% of the time with 4 per process: request cpus_per_task 1" in tips[1]
    assert row["runtime_unused_share"] == pytest.approx(1 - 180 / 3600)
    assert ("the longest segment took 2.0 min of 30 requested (95% of the requested time went "
            "unused): resources.runtime 5") in tips[2]


def test_a_run_that_uses_what_it_asked_for_gets_no_advice():
    tries = [segment_usage(RANKS[:1], 1700.0, 1, "time budget")]
    row = used_vs_requested(tries, {"cpus_per_task": 1, "mem_mb": 450, "runtime": 30})
    assert request_advice(pd.DataFrame([{"strategy": "cpu", "cpus_per_task": 1, **row}])) == []


def test_the_job_venv_build_share_is_said_and_advised_on_past_a_tenth(monkeypatch):
    monkeypatch.setenv("CIFARFLOW_ENV_BUILD_S", "90")  # what the prologue exports
    slow = [segment_usage(RANKS[:1], 300.0, 1, None), segment_usage(RANKS[:1], 500.0, 1, None)]
    assert slow[0]["env_build_s"] == 90
    monkeypatch.setenv("CIFARFLOW_ENV_BUILD_S", "5")
    fast = [segment_usage(RANKS[:1], 300.0, 1, None)]
    monkeypatch.delenv("CIFARFLOW_ENV_BUILD_S")
    plain = [segment_usage(RANKS[:1], 300.0, 1, None)]
    assert plain[0]["env_build_s"] is None  # env.mode current, venv: nothing was built
    res = {"cpus_per_task": 1, "mem_mb": 500, "runtime": 30}
    rows = [{"strategy": s, **used_vs_requested(t, res)}
            for s, t in (("ddp", slow), ("cpu", fast), ("gpu", plain))]
    assert rows[0]["env_build_s"] == 90 and rows[0]["env_build_share"] == pytest.approx(180 / 980)
    assert "env_build_s" not in rows[2]
    assert env_build_advice(pd.DataFrame(rows)) == [
        "cpu (1 run(s)): building the job venv took 5 s, 2% of each segment job",  # said only
        "ddp (1 run(s)): building the job venv took 90 s, 18% of each segment job: ask for "
        "fewer, longer segments (segments.count, resources.runtime of 15 min or more; "
        "resources.autosize keeps to that) or use env.mode venv with a venv built once on a "
        "shared filesystem"]
    assert env_build_advice(pd.DataFrame([rows[2]])) == []


def bf16_rows(*runs) -> pd.DataFrame:
    base = {"strategy": "cpu", "device": "cpu", "model": "lenet", "batch_size": 512,
            "cpus_per_task": 2, "status": "ok"}
    return pd.DataFrame([{**base, "run": run, "amp": amp, "images_per_sec": ips}
                         for run, amp, ips in runs])


AMX = {"model": "Intel(R) Xeon(R) Platinum 8480+", "flags": ["amx_bf16", "avx512_bf16"],
       "bf16_native": True}


def test_bf16_advice_from_a_run_of_the_sweep_that_used_it():
    df = bf16_rows(("f32", "none", 19_000.0), ("bf", "bf16", 26_600.0))
    assert bf16_advice(df, AMX) == [
        "f32: this CPU computes bf16 natively (amx_bf16/avx512_bf16); bf with amp bf16 trained "
        "x1.40 faster here: set train.amp: bf16 (or auto)"]
    assert bf16_advice(df, {**AMX, "bf16_native": False, "flags": []}) == []  # emulated: no
    slower = bf16_rows(("f32", "none", 19_000.0), ("bf", "bf16", 18_000.0))
    assert bf16_advice(slower, AMX) == []


def test_bf16_advice_from_bench_only_for_the_cpu_model_it_measured(monkeypatch):
    import cifarflow.results.advice as agg

    monkeypatch.setitem(agg.BF16_BENCH, AMX["model"], ("lenet", 512, 2, 10_000.0, 15_000.0))
    df = bf16_rows(("f32", "none", 9_000.0))
    [tip] = bf16_advice(df, AMX)
    assert "bench/ measured lenet batch 512 on 2 threads x1.50 faster with amp bf16" in tip
    assert bf16_advice(df, {**AMX, "model": "another CPU"}) == []  # not measured there


def test_a_run_says_what_data_it_trained_on():
    from cifarflow.results.table import data_columns

    fetched = {"source": "download", "md5": "c58f30108f718f92721af3b95e74349a",
               "data_id": "c58f30108f718f92721af3b95e74349a"}
    assert data_columns(fetched["data_id"], fetched) == {
        "data_source": "download", "data_md5": "c58f30108f718f92721af3b95e74349a"}
    # results/data holds other data now: the run's own data id still says what it was
    assert data_columns("c58f30108f718f92721af3b95e74349a", None) == {
        "data_source": "cifar-10", "data_md5": "c58f30108f718f92721af3b95e74349a"}
    assert data_columns("synthetic-0123456789ab", None) == {"data_source": "synthetic",
                                                            "data_md5": ""}
