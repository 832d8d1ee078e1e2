"""Summary table, plots and advice from the metric histories of all runs."""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = ["run", "strategy", "device", "model", "batch_size", "world_size", "cpus_per_task",
           "epochs",
           "images_per_sec", "images_per_sec_per_core", "train_loss", "test_acc", "wall_s",
           "epoch_s", "peak_mem_mb", "gpu_util_pct", "segments", "attempts", "requeues",
           "early_stops", "slurm_job_ids", "hosts", "status", "fallbacks"]
SCALING_KEYS = ("world_size", "replicas")


def load_history(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def summarize_run(name: str, run: dict) -> dict:
    spec, res = run["spec"], run["resources"]
    row = {"run": name, "strategy": run["strategy"], "device": spec["device"], "model": spec["model"],
           "batch_size": spec["batch_size"], "world_size": spec.get("world_size", 1),
           "cpus_per_task": res.get("cpus_per_task"), "epochs": spec["epochs"],
           **{f"sweep_{k}": v for k, v in run.get("swept", {}).items()}}
    path = run.get("metrics")
    if not path or not Path(path).is_file():
        return {**row, "status": "missing"}
    history = load_history(path)
    manifest = Path(path).with_name("checkpoint.json")
    meta = json.loads(manifest.read_text()) if manifest.is_file() else {}
    row["fallbacks"] = " | ".join(meta.get("events", []))
    attempts, requeues = {}, {}  # segment -> its last attempt / Slurm requeue of the job
    for r in meta.get("segment_runs", []):
        attempts[r["segment"]] = max(attempts.get(r["segment"], 0), r["attempt"])
        requeues[r["segment"]] = max(requeues.get(r["segment"], 0), r.get("requeue", 0))
    row["attempts"] = sum(attempts.values())  # a retried segment counts each try
    row["requeues"] = sum(requeues.values())
    row["early_stops"] = sum(1 for r in meta.get("segment_runs", []) if r["stopped"])
    if not history:
        return {**row, "status": "empty"}
    last = history[-1]
    timed = history[1:] or history  # epoch 1 includes warm-up
    ips = sum(h["images_per_sec"] for h in timed) / len(timed)
    cores = (res.get("cpus_per_task") or 1) * row["world_size"]
    util = [h["gpu_util_pct"] for h in history if h.get("gpu_util_pct") is not None]
    jobs = sorted({h.get("slurm_job_id") for h in history if h.get("slurm_job_id")})
    hosts = sorted({host for h in history for host in h.get("hosts", [])})
    return {**row, "epochs": last["epoch"], "images_per_sec": ips,
            "images_per_sec_per_core": ips / cores, "train_loss": last["train_loss"],
            "test_acc": last["test_acc"], "wall_s": sum(h["wall_s"] for h in history),
            "epoch_s": sum(h["wall_s"] for h in timed) / len(timed),
            "peak_mem_mb": max(h["peak_mem_mb"] for h in history),
            "gpu_util_pct": sum(util) / len(util) if util else None,
            "segments": run.get("segments"), "slurm_job_ids": " ".join(jobs),
            "hosts": " ".join(hosts),
            "status": "ok" if last["epoch"] >= spec["epochs"] else "incomplete"}


def advice(df) -> list[str]:
    """Recommendations in the seed's spirit, computed from the measurements."""
    ok = df[df.status == "ok"]
    tips = []
    if ok.empty:
        return ["no finished runs to advise on"]
    best = ok.loc[ok.images_per_sec.idxmax()]
    tips.append(f"fastest run: {best.run} at {best.images_per_sec:,.0f} images/s")
    eff = ok.loc[ok.images_per_sec_per_core.idxmax()]
    tips.append(f"best throughput per core: {eff.run} ({eff.images_per_sec_per_core:,.0f} "
                "images/s per core) - the cheapest way to spend an allocation")
    same = ["strategy", "model", "batch_size", "world_size"]  # all but the cores
    for key, group in ok.dropna(subset=["cpus_per_task"]).groupby(same):
        g = group.sort_values("cpus_per_task").drop_duplicates("cpus_per_task")
        for prev, cur in zip(g.itertuples(), list(g.itertuples())[1:]):
            gain = cur.images_per_sec / prev.images_per_sec
            if gain < 1 + 0.5 * (cur.cpus_per_task / prev.cpus_per_task - 1):
                tips.append(f"{cur.run}: {prev.cpus_per_task} -> {cur.cpus_per_task} cpus gives "
                            f"only x{gain:.2f}: adding cores stops paying there")
                break
    cpu = ok[ok.device == "cpu"]
    for row in ok[ok.device == "cuda"].itertuples():
        if not cpu.empty and row.images_per_sec < cpu.images_per_sec.max():
            tips.append(f"{row.run} is slower than the best CPU run: this model does not need a GPU")
        if row.gpu_util_pct is not None and row.gpu_util_pct < 50:
            tips.append(f"{row.run} uses the GPU only {row.gpu_util_pct:.0f}% of the time: "
                        "share it with MPS replicas or use a CPU job")
    for row in df[df.status != "ok"].itertuples():
        tips.append(f"{row.run}: {row.status} (see results/logs/train/{row.run}/)")
    return tips


def scaling_table(df):
    """Speedup and efficiency against the 1-process (or smallest) run of each group."""
    import pandas as pd

    rows = []
    ok = df[df.status == "ok"]
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


def plot_all(df, histories: dict, out_dir: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    ok = df[df.status == "ok"]

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    a1.barh(ok.run, ok.images_per_sec, color="tab:blue")
    a1.set_xlabel("training images / s")
    a1.set_title("throughput")
    a2.barh(ok.run, ok.test_acc, color="tab:green")
    a2.set_xlabel("test accuracy")
    a2.set_xlim(0, 1)
    a2.set_title("accuracy")
    fig.tight_layout()
    paths["throughput"] = out_dir / "throughput_accuracy.png"
    fig.savefig(paths["throughput"], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for name, hist in histories.items():
        epochs = [h["epoch"] for h in hist]
        axes[0].plot(epochs, [h["train_loss"] for h in hist], marker="o", label=name)
        axes[1].plot(epochs, [h["test_acc"] for h in hist], marker="o", label=name)
        axes[2].plot(epochs, [h["wall_s"] for h in hist], marker="o", label=name)
    for ax, title in zip(axes, ["train loss", "test accuracy", "seconds per epoch"]):
        ax.set_title(title)
        ax.set_xlabel("epoch")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    paths["curves"] = out_dir / "curves.png"
    fig.savefig(paths["curves"], dpi=110)
    plt.close(fig)

    swept = [c for c in df.columns if c.startswith("sweep_")]
    if swept:
        fig, axes = plt.subplots(1, len(swept), figsize=(5 * len(swept), 4), squeeze=False)
        for ax, col in zip(axes[0], swept):
            for strategy, g in ok.dropna(subset=[col]).groupby("strategy"):
                g = g.groupby(col).images_per_sec.mean().sort_index()
                ax.plot(g.index.astype(str), g.values, marker="o", label=strategy)
            ax.set_xlabel(col.removeprefix("sweep_"))
            ax.set_ylabel("images / s")
            ax.legend()
        fig.tight_layout()
        paths["sweep"] = out_dir / "sweep_throughput.png"
        fig.savefig(paths["sweep"], dpi=110)
        plt.close(fig)

    scaling = scaling_table(df)
    if not scaling.empty:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for strategy, g in scaling.groupby("strategy"):
            a1.plot(g.world_size, g.speedup, marker="o", label=strategy)
            a2.plot(g.world_size, g.efficiency, marker="o", label=strategy)
        a1.set_title("speedup")
        a2.set_title("scaling efficiency")
        for ax in (a1, a2):
            ax.set_xlabel("processes (world size / replicas)")
            ax.legend()
        fig.tight_layout()
        paths["scaling"] = out_dir / "scaling.png"
        fig.savefig(paths["scaling"], dpi=110)
        plt.close(fig)
    return paths


def aggregate(runs: dict, out_dir: Path, plots_dir: Path, keep_missing: bool = False) -> None:
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    plots_dir.mkdir(parents=True, exist_ok=True)
    rows = [summarize_run(name, run) for name, run in runs.items()]
    bad = [r["run"] for r in rows if r["status"] != "ok"]
    if bad and not keep_missing:
        raise ValueError(f"runs without complete metrics: {bad} (use --keep-going to "
                         "summarise what finished)")
    df = pd.DataFrame(rows)
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df.reindex(columns=COLUMNS + extra)
    df.to_csv(out_dir / "summary.csv", index=False, float_format="%.6g")
    histories = {r["run"]: load_history(runs[r["run"]]["metrics"])
                 for r in rows if r["status"] in ("ok", "incomplete")}
    plot_all(df, histories, plots_dir)
    tips = advice(df)
    scaling = scaling_table(df)
    lines = ["# Advice", ""] + [f"- {t}" for t in tips]
    if not scaling.empty:
        lines += ["", "## Scaling", "", scaling.to_markdown(index=False, floatfmt=".2f")]
    (out_dir / "advice.md").write_text("\n".join(lines) + "\n")
    print(df[["run", "images_per_sec", "test_acc", "train_loss", "status"]].to_string(index=False))
    print("\n".join(tips))
