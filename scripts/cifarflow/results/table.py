"""The summary table: one row per run from its metrics, its checkpoint manifest and its
tries (what it used against what it asked), the columns in summary.csv's order. No torch."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..early_stop import EarlyStop
from ..files import read_jsonl
from ..job.tries import recorded, tries_of

COLUMNS = ["run", "strategy", "device", "model", "batch_size", "world_size", "cpus_per_task",
           "epochs", "amp", "augment", "label_smoothing",
           "images_per_sec", "images_per_sec_per_core", "train_loss", "test_acc", "test_acc_tta",
           "wall_s",
           "epoch_s", "peak_mem_mb", "gpu_util_pct", "segments", "attempts", "requeues",
           "early_stops", "slurm_job_ids", "hosts", "status", "early_stop", "plateau",
           "pruned_at", "resized", "data_source", "data_md5", "data_id", "weights_sha256",
           "fallbacks", "cpu_efficiency", "mem_used_mb", "mem_requested_mb", "runtime_used_min",
           "runtime_requested_min", "usage_from", "cpu_efficiency_measured",
           "mem_used_measured_mb", "runtime_used_measured_min", "mem_requested_last_mb", "runtime_requested_last_min",
           "queue_wait_s", "env_build_s", "last_ended", "try_ends", "advice"]
DIVERGED = "diverged"  # the early-end reason of a fused member whose loss turned NaN/inf
FINISHED = ("ok", "early_stopped")  # runs that trained to their end (early_stop's included)


def data_columns(data_id: str, record: dict | None) -> dict:
    """What the run trained on: the data source and the tarball's md5, from the fetch record
    of results/data where it is still the run's data (same data id), else from the data id
    (a real archive's md5, or a synthetic set's parameters)."""
    if record:
        return {"data_source": record["source"], "data_md5": record["md5"]}
    if data_id.startswith("synthetic-"):
        return {"data_source": "synthetic", "data_md5": ""}
    return {"data_source": "cifar-10" if data_id else "", "data_md5": data_id}


def augment_label(augment: dict | None) -> str:
    """train.augment as the summary shows it: "flip+crop4", "flip", "crop2" or "none"."""
    augment = augment or {}
    parts = (["flip"] if augment.get("flip") else []) + \
        ([f"crop{augment['crop']}"] if augment.get("crop") else [])
    return "+".join(parts) or "none"


def summarize_run(name: str, run: dict, states_of=None) -> dict:
    spec, res = run["spec"], run["resources"]
    row = {"run": name, "strategy": run["strategy"], "device": spec["device"], "model": spec["model"],
           "batch_size": spec["batch_size"], "world_size": spec.get("world_size", 1),
           "cpus_per_task": res.get("cpus_per_task"), "epochs": spec["epochs"],
           "epochs_planned": spec["epochs"], "planned_segments": run.get("planned_segments"),
           "augment": augment_label(spec.get("augment")),
           "label_smoothing": spec.get("label_smoothing", 0.0),
           **data_columns(spec.get("data_id", ""), run.get("data")),
           "data_id": spec.get("data_id", ""),
           **{f"sweep_{k}": v for k, v in run.get("swept", {}).items()}}
    path = run.get("metrics")
    if not path or not Path(path).is_file():
        return {**row, "status": "missing"}
    history = read_jsonl(path)
    manifest = Path(path).with_name("checkpoint.json")
    meta = json.loads(manifest.read_text()) if manifest.is_file() else {}
    row["fallbacks"] = " | ".join(meta.get("events", []))
    row["weights_sha256"] = meta.get("weights_sha256", "")  # engine/checkpoints/digest.py
    # elastic world-size changes: the run is no longer bit-exact from there
    row["resized"] = " ".join(f"{r['from']}->{r['to']}@epoch{r['epoch'] + 1}"
                              for r in meta.get("resizes", []))
    attempts, requeues = {}, {}  # segment -> its last attempt / Slurm requeue of the job
    for r in meta.get("segment_runs", []):
        attempts[r["segment"]] = max(attempts.get(r["segment"], 0), r["attempt"])
        requeues[r["segment"]] = max(requeues.get(r["segment"], 0), r.get("requeue", 0))
    row["attempts"] = sum(attempts.values())  # a retried segment counts each try
    ends = Counter(t["ended"] for t in tries_of(Path(path).parent.parent, None, invocation="",
                                                states_of=states_of, logs_dir=run.get("logs")))
    row["try_ends"] = ", ".join(f"{end} {n}" for end, n in sorted(ends.items()))
    row["requeues"] = sum(requeues.values())
    row["early_stops"] = sum(1 for r in meta.get("segment_runs", []) if r["stopped"])
    row.update(used_vs_requested(meta.get("segment_runs", []), res))
    if not history:
        return {**row, "status": "empty"}
    last = history[-1]
    row["early_stop"] = meta.get("early_stop", "")
    if spec.get("early_stop"):
        stopping = EarlyStop.of(spec["early_stop"], spec["model"])
        flat = stopping.loss_plateau(history)
        row["plateau"] = flat.describe() if flat else ""
    timed = history[1:] or history  # epoch 1 includes warm-up
    ips = sum(h["images_per_sec"] for h in timed) / len(timed)
    cores = (res.get("cpus_per_task") or 1) * row["world_size"]
    util = [h["gpu_util_pct"] for h in history if h.get("gpu_util_pct") is not None]
    jobs = sorted({h.get("slurm_job_id") for h in history if h.get("slurm_job_id")})
    hosts = sorted({host for h in history for host in h.get("hosts", [])})
    return {**row, "epochs": last["epoch"], "amp": last.get("amp", spec.get("amp")),
            "images_per_sec": ips,
            "images_per_sec_per_core": ips / cores, "train_loss": last["train_loss"],
            "test_acc": last["test_acc"], "test_acc_tta": last.get("test_acc_tta"),
            "wall_s": sum(h["wall_s"] for h in history),
            "epoch_s": sum(h["wall_s"] for h in timed) / len(timed),
            "peak_mem_mb": max(h["peak_mem_mb"] for h in history),
            "gpu_util_pct": sum(util) / len(util) if util else None,
            "segments": run.get("segments"), "slurm_job_ids": " ".join(jobs),
            "hosts": " ".join(hosts),
            "status": ("pruned" if run.get("pruned_at") else
                       "ok" if last["epoch"] >= spec["epochs"] else
                       "diverged" if str(row["early_stop"]).startswith(DIVERGED) else
                       "early_stopped" if row["early_stop"] else "incomplete"),
            "pruned_at": run.get("pruned_at"), "cores": cores}


def was_cancelled(name: str, run: dict, cancelled: dict[str, dict]) -> bool:
    """Whether a job of this run was cancelled from outside (``cancelled``: the controller's
    record, slurm_queue.JobRecord.cancelled): among the runs it names (a pack's members,
    before they started too), or a try's job."""
    if any(name in e.get("runs", [e.get("run")]) for e in cancelled.values()):
        return True
    path = run.get("metrics")
    if not path or not cancelled:
        return False
    return any(t["job_id"] in cancelled for t in recorded(Path(path).parent.parent, None, ""))


def used_vs_requested(tries: list[dict], res: dict) -> dict:
    """Each segment try's measurement (all ranks together) against the run's request:
    CPU time over cores x wall, the peak memory of the largest try, the longest wall."""
    measured = [t for t in tries if "cpu_s" in t]
    out = {"mem_requested_mb": res.get("mem_mb", 0) * res.get("nodes", 1),
           "runtime_requested_min": res.get("runtime")}
    if not measured:
        return out
    core_s = sum(t["wall_s"] * t["cpus"] for t in measured)
    last = measured[-1]
    if last.get("requested_mem_mb"):  # what the last try asked (resources.autosize, retries)
        out["mem_requested_last_mb"] = last["requested_mem_mb"] * res.get("nodes", 1)
    if last.get("requested_runtime_min"):
        out["runtime_requested_last_min"] = last["requested_runtime_min"]
    waits = [t["queue_wait_s"] for t in measured if t.get("queue_wait_s") is not None]
    asked_s = sum(60 * (t.get("requested_runtime_min") or res.get("runtime") or 0) for t in measured)
    if asked_s:  # what backfill could not give others: requested, not used
        out["runtime_unused_share"] = max(0.0, 1 - sum(t["wall_s"] for t in measured) / asked_s)
    builds = [t for t in measured if t.get("env_build_s") is not None]
    if builds:  # env.mode slurm_tmpdir: each try's job built its venv before training
        out["env_build_s"] = sum(t["env_build_s"] for t in builds) / len(builds)
        out["env_build_share"] = (sum(t["env_build_s"] for t in builds)
                                  / sum(t["env_build_s"] + t["wall_s"] for t in builds))
    return {**out, "cpu_efficiency": sum(t["cpu_s"] for t in measured) / core_s if core_s else None,
            "mem_used_mb": max(t["peak_rss_mb"] for t in measured),
            "runtime_used_min": max(t["wall_s"] for t in measured) / 60,
            "queue_wait_s": sum(waits) / len(waits) if waits else None,
            "last_ended": last["ended"],
            "job_hours": sum(t["wall_s"] for t in measured) / 3600}


def scaling_table(df):
    """Speedup and efficiency against the 1-process (or smallest) run of each group."""
    import pandas as pd

    rows = []
    ok = df[df.status.isin(FINISHED)]
    for strategy, group in ok.groupby("strategy"):
        g = group.sort_values("world_size")
        if g.world_size.nunique() < 2:
            continue
        base = g.iloc[0]
        for r in g.itertuples():
            speedup = r.images_per_sec / base.images_per_sec
            rows.append({"strategy": strategy, "world_size": r.world_size, "speedup": speedup,
                         "efficiency": speedup / (r.world_size / base.world_size)})
    return pd.DataFrame(rows)
