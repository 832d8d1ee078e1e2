"""Summary table, plots and advice from the metric histories of all runs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..early_stop import EarlyStop, hint_for
from ..files import read_jsonl
from ..job.tries import ended_states, tries_of

COLUMNS = ["run", "strategy", "device", "model", "batch_size", "world_size", "cpus_per_task",
           "epochs", "amp",
           "images_per_sec", "images_per_sec_per_core", "train_loss", "test_acc", "wall_s",
           "epoch_s", "peak_mem_mb", "gpu_util_pct", "segments", "attempts", "requeues",
           "early_stops", "slurm_job_ids", "hosts", "status", "early_stop", "plateau",
           "pruned_at", "resized", "data_source", "data_md5",
           "fallbacks", "cpu_efficiency", "mem_used_mb", "mem_requested_mb", "runtime_used_min",
           "runtime_requested_min", "mem_requested_last_mb", "runtime_requested_last_min",
           "queue_wait_s", "env_build_s", "last_ended", "try_ends", "advice"]
MARGIN = 1.25  # what to request next time: the measured peak plus a quarter
MAX_BARS, MAX_LEGEND = 50, 20  # plots of big sweeps stay readable
DIVERGED = "diverged"  # the early-end reason of a fused member whose loss turned NaN/inf
FINISHED = ("ok", "early_stopped")  # runs that trained to their end (early_stop's included)


class Tip(str):
    """One line of the advice, and the runs it is about (summary.csv's `advice` column)."""

    runs: tuple = ()

    def __new__(cls, text: str, *runs: str) -> "Tip":
        tip = super().__new__(cls, text)
        tip.runs = runs
        return tip


def advice_per_run(tips: list[str]) -> dict[str, str]:
    """Each run's tips, the one it leads first, without its name in front: the verdict
    `cifarflow show` prints beside the run. Tips about a request or a strategy stay out."""
    found: dict[str, list[str]] = {}
    for tip in tips:
        for run in getattr(tip, "runs", ()):
            found.setdefault(run, []).append(tip)
    return {run: " | ".join(t.removeprefix(f"{run}: ") for t in
                            sorted(own, key=lambda t: not t.startswith(f"{run}: ")))
            for run, own in found.items()}


def data_columns(data_id: str, record: dict | None) -> dict:
    """What the run trained on: the data source and the tarball's md5, from the fetch record
    of results/data where it is still the run's data (same data id), else from the data id
    (a real archive's md5, or a synthetic set's parameters)."""
    if record:
        return {"data_source": record["source"], "data_md5": record["md5"]}
    if data_id.startswith("synthetic-"):
        return {"data_source": "synthetic", "data_md5": ""}
    return {"data_source": "cifar-10" if data_id else "", "data_md5": data_id}


def summarize_run(name: str, run: dict, states_of=None) -> dict:
    spec, res = run["spec"], run["resources"]
    row = {"run": name, "strategy": run["strategy"], "device": spec["device"], "model": spec["model"],
           "batch_size": spec["batch_size"], "world_size": spec.get("world_size", 1),
           "cpus_per_task": res.get("cpus_per_task"), "epochs": spec["epochs"],
           "epochs_planned": spec["epochs"], "planned_segments": run.get("planned_segments"),
           **data_columns(spec.get("data_id", ""), run.get("data")),
           **{f"sweep_{k}": v for k, v in run.get("swept", {}).items()}}
    path = run.get("metrics")
    if not path or not Path(path).is_file():
        return {**row, "status": "missing"}
    history = read_jsonl(path)
    manifest = Path(path).with_name("checkpoint.json")
    meta = json.loads(manifest.read_text()) if manifest.is_file() else {}
    row["fallbacks"] = " | ".join(meta.get("events", []))
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
            "test_acc": last["test_acc"], "wall_s": sum(h["wall_s"] for h in history),
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


def request_advice(df) -> list[str]:
    """Per strategy and request: what to ask for next time, from what the runs used, and
    what it saves (the seed's advice: small models need few cores and no GPU)."""
    tips = []
    measured = df.dropna(subset=["mem_used_mb"]) if "mem_used_mb" in df else df.iloc[0:0]
    keys = ["strategy", "mem_requested_mb", "cpus_per_task", "runtime_requested_min"]
    for (strategy, mem, cpus, runtime), g in measured.groupby(keys):
        n, hours = len(g), g.job_hours.sum()
        need = int(-(-g.mem_used_mb.max() * MARGIN // 100) * 100)
        if need < 0.8 * mem:
            tips.append(f"{strategy} ({n} run(s)): used at most {g.mem_used_mb.max():,.0f} MB of "
                        f"{mem:,.0f} MB requested: request resources.mem_mb ~{need:,} "
                        f"(saves ~{(mem - need) * hours / 1024:,.1f} GB-hours)")
        eff = g.cpu_efficiency.mean()
        if cpus > 1 and eff < 0.5:
            fewer = max(1, int(round(cpus * eff / 0.8)))
            tips.append(f"{strategy} ({n} run(s)): the cores were busy {eff:.0%} of the time "
                        f"with {cpus} per process: request cpus_per_task {fewer}")
        longest = g.runtime_used_min.max()
        unused = g.runtime_unused_share.mean() if "runtime_unused_share" in g else 0.0
        if longest < 0.5 * runtime and (g.last_ended == "completed").all():
            ask = max(5, int(-(-longest * 1.5 // 1)))
            tips.append(f"{strategy} ({n} run(s)): the longest segment took {longest:.1f} min of "
                        f"{runtime:g} requested ({unused:.0%} of the requested time went "
                        f"unused): resources.runtime {ask} would queue sooner")
    return tips


ENV_BUILD_SHARE = 0.10  # a job venv built in more than this share of a segment job: advise


def env_build_advice(df) -> list[str]:
    """Per strategy: where building the job venv (env.mode slurm_tmpdir) takes more than
    ENV_BUILD_SHARE of each segment job, the two ways to pay it less often."""
    if "env_build_share" not in df:
        return []
    tips = []
    for strategy, g in df.dropna(subset=["env_build_share"]).groupby("strategy"):
        share = g.env_build_share.mean()
        if share > ENV_BUILD_SHARE:
            tips.append(f"{strategy} ({len(g)} run(s)): building the job venv took "
                        f"{g.env_build_s.mean():.0f} s, {share:.0%} of each segment job: ask "
                        "for fewer, longer segments (segments.count, resources.runtime) or use "
                        "env.mode venv with a venv built once on a shared filesystem")
    return tips


# CPU bf16 measured with `bench/bench.py --amp-only` (bench/README.md, "CPU bf16"): the CPU
# model it ran on -> (model, batch size, threads, images/s amp none, images/s amp bf16).
# Empty: the one measurement so far ran on a contended box (bench/README.md); only an
# uncontended figure belongs here. Until then the advice uses a bf16 run of the sweep.
BF16_BENCH: dict[str, tuple] = {}


def bf16_advice(df, cpu: dict | None) -> list[str]:
    """Runs in float32 on a CPU that computes bf16 natively (AMX, AVX512-BF16): how much
    faster bf16 was, measured by a run of this sweep that used it (same strategy, model,
    batch and cores), else by bench/ on this CPU model; nothing unmeasured is promised."""
    if not cpu or not cpu.get("bf16_native") or "amp" not in df:
        return []
    ok = df[df.status.isin(FINISHED) & (df.device == "cpu")]
    same = ["strategy", "model", "batch_size", "cpus_per_task"]
    tips = []
    for row in ok[ok.amp == "none"].itertuples():
        twin = ok[(ok.amp == "bf16") & (ok[same] == [getattr(row, k) for k in same]).all(axis=1)]
        native = "/".join(f for f in cpu.get("flags", []) if f in ("amx_bf16", "avx512_bf16"))
        if not twin.empty:
            gain = twin.images_per_sec.max() / row.images_per_sec
            if gain > 1.05:
                tips.append(Tip(f"{row.run}: this CPU computes bf16 natively ({native}); "
                                f"{twin.loc[twin.images_per_sec.idxmax()].run} with amp bf16 "
                                f"trained x{gain:.2f} faster here: set train.amp: bf16 (or auto)",
                                row.run))
            continue
        bench = BF16_BENCH.get(cpu.get("model"))
        if bench and bench[0] == row.model:
            model, batch, threads, none_ips, bf16_ips = bench
            tips.append(Tip(f"{row.run}: this CPU ({cpu['model']}) computes bf16 natively "
                            f"({native}); bench/ measured {model} batch {batch} on {threads} "
                            f"threads x{bf16_ips / none_ips:.2f} faster with amp bf16 "
                            f"({none_ips:,.0f} -> {bf16_ips:,.0f} images/s): try train.amp: "
                            "bf16 (or auto)", row.run))
    return tips


def advice(df, cpu_info: dict | None = None) -> list[str]:
    """Recommendations in the seed's spirit, computed from the measurements; ``cpu_info``:
    the environment's CPU features (engine.hardware.cpu_features)."""
    ok = df[df.status.isin(FINISHED)]
    tips = []
    if ok.empty:
        return ["no finished runs to advise on"]
    best = ok.loc[ok.images_per_sec.idxmax()]
    tips.append(Tip(f"fastest run: {best.run} at {best.images_per_sec:,.0f} images/s", best.run))
    eff = ok.loc[ok.images_per_sec_per_core.idxmax()]
    tips.append(Tip(f"best throughput per core: {eff.run} ({eff.images_per_sec_per_core:,.0f} "
                    "images/s per core) - the cheapest way to spend an allocation", eff.run))
    same = ["strategy", "model", "batch_size", "world_size"]  # all but the cores
    for key, group in ok.dropna(subset=["cpus_per_task"]).groupby(same):
        g = group.sort_values("cpus_per_task").drop_duplicates("cpus_per_task")
        for prev, cur in zip(g.itertuples(), list(g.itertuples())[1:]):
            gain = cur.images_per_sec / prev.images_per_sec
            if gain < 1 + 0.5 * (cur.cpus_per_task / prev.cpus_per_task - 1):
                tips.append(Tip(f"{cur.run}: {prev.cpus_per_task} -> {cur.cpus_per_task} cpus "
                                f"gives only x{gain:.2f}: adding cores stops paying there",
                                cur.run))
                break
    cpu = ok[ok.device == "cpu"]
    for row in ok[ok.device == "cuda"].itertuples():
        if not cpu.empty and row.images_per_sec < cpu.images_per_sec.max():
            tips.append(Tip(f"{row.run} is slower than the best CPU run: this model does not "
                            "need a GPU", row.run))
        if row.gpu_util_pct is not None and row.gpu_util_pct < 50:
            tips.append(Tip(f"{row.run} uses the GPU only {row.gpu_util_pct:.0f}% of the time: "
                            "share it with MPS replicas or use a CPU job", row.run))
    tips += bf16_advice(df, cpu_info)
    tips += request_advice(df)
    tips += env_build_advice(df)
    tips += pruning_advice(df)
    tips += plateau_advice(df)
    for row in df[~df.status.isin([*FINISHED, "pruned"])].itertuples():
        tips.append(Tip(f"{row.run}: {row.status} (see results/logs/train/{row.run}/)", row.run))
    return tips


def plateau_advice(df) -> list[str]:
    """Runs whose loss stopped moving (train.early_stop's patience, on or off), with the
    reason a known model does so and what to try; runs early_stop ended."""
    tips = []
    for row in df.itertuples():
        if isinstance(getattr(row, "plateau", None), str) and row.plateau:
            stopped = (f", ended by train.early_stop at epoch {row.epochs} of "
                       f"{row.epochs_planned}" if row.status == "early_stopped" else "")
            tips.append(Tip(f"{row.run}: stopped learning: {row.plateau}{stopped}. "
                            f"{hint_for(row.model)}", row.run))
        elif row.status == "early_stopped":
            tips.append(Tip(f"{row.run}: {row.early_stop}, at epoch {row.epochs} of "
                            f"{row.epochs_planned}", row.run))
    return tips


def pruning_advice(df) -> list[str]:
    """Per strategy with pruned runs: the winner, and the compute the pruning did not spend
    (the pruned runs' remaining epochs at their own measured epoch time)."""
    tips = []
    for strategy, group in df.groupby("strategy"):
        pruned, finished = group[group.status == "pruned"], group[group.status.isin(FINISHED)]
        if pruned.empty:
            continue
        left = pruned.epochs_planned - pruned.epochs
        core_h = (left * pruned.epoch_s * pruned.cores).sum() / 3600
        segments = int((pruned.planned_segments - pruned.segments).sum())
        tips.append(f"{strategy}: pruning stopped {len(pruned)} of {len(group)} runs early "
                    f"(at segments {', '.join(map(str, sorted(set(pruned.pruned_at.astype(int)))))}): "
                    f"{segments} segments, {int(left.sum())} epochs, ~{core_h:.2g} core-hours "
                    "not run")
        if not finished.empty:
            win = finished.sort_values(["test_acc", "run"], ascending=[False, True]).iloc[0]
            tips.append(Tip(f"{strategy}: winner {win.run}, test accuracy {win.test_acc:.3f}",
                            win.run))
    return tips


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


def _axes_style(ax, integer_x: bool = False, zero_y: bool = False, log_y: bool = False) -> None:
    """Plain numbers (no offset or scientific notation), whole-number epochs, rates from 0;
    losses on a log axis (a diverged run would flatten all the others)."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    if log_y:
        ax.set_yscale("log")
    else:
        fmt = ScalarFormatter(useOffset=False)
        fmt.set_scientific(False)
        ax.yaxis.set_major_formatter(fmt)
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if zero_y:
        ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def plot_all(df, histories: dict, out_dir: Path) -> dict:
    """PNG plots; pruned runs are drawn dashed and grey-hatched, so they read as stopped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    shown = df[df.status.isin([*FINISHED, "pruned"])]
    if len(shown) > MAX_BARS:  # a big sweep: its best runs, readable
        shown = shown.sort_values(["test_acc", "run"], ascending=[False, True]).head(MAX_BARS)
    shown = shown.iloc[::-1]  # first run at the top

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, max(3, 0.35 * len(shown) + 1.5)))
    hatch = ["//" if s == "pruned" else "" for s in shown.status]
    a1.barh(shown.run, shown.images_per_sec, color="tab:blue", hatch=hatch, edgecolor="white")
    a1.set_xlabel("training images / s")
    a1.set_title("throughput" if len(shown) == (df.status.isin([*FINISHED, "pruned"])).sum()
                 else f"throughput, the {len(shown)} most accurate runs")
    a2.barh(shown.run, shown.test_acc, color="tab:green", hatch=hatch, edgecolor="white")
    a2.set_xlabel("test accuracy (hatched: pruned)" if "pruned" in set(shown.status)
                  else "test accuracy")
    a2.set_xlim(0, 1)
    a2.set_title("accuracy")
    for ax in (a1, a2):
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter(useOffset=False))
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    paths["throughput"] = out_dir / "throughput_accuracy.png"
    fig.savefig(paths["throughput"], dpi=110)
    plt.close(fig)

    status = dict(zip(df.run, df.status))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for name, hist in histories.items():
        style = dict(marker="o", label=name)
        if status.get(name) == "pruned":
            style.update(linestyle="--", alpha=0.6, label=f"{name} (pruned)")
        epochs = [h["epoch"] for h in hist]
        axes[0].plot(epochs, [h["train_loss"] for h in hist], **style)
        axes[1].plot(epochs, [h["test_acc"] for h in hist], **style)
        axes[2].plot(epochs, [h["wall_s"] for h in hist], **style)
    for ax, title in zip(axes, ["train loss", "test accuracy", "seconds per epoch"]):
        ax.set_title(title)
        ax.set_xlabel("epoch")
        loss = title == "train loss"
        _axes_style(ax, integer_x=True, zero_y=not loss, log_y=loss)
    if len(histories) <= MAX_LEGEND:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    paths["curves"] = out_dir / "curves.png"
    fig.savefig(paths["curves"], dpi=110)
    plt.close(fig)

    swept = [c for c in df.columns if c.startswith("sweep_") and df[c].nunique() > 1]
    if swept:
        # one line per strategy and combination of the other swept values: nothing averaged
        fig, axes = plt.subplots(1, len(swept), figsize=(5.5 * len(swept), 4), squeeze=False)
        for ax, col in zip(axes[0], swept):
            others = [c for c in swept if c != col]
            for key, g in shown.dropna(subset=[col]).groupby(["strategy", *others]):
                key = key if isinstance(key, tuple) else (key,)
                label = " ".join([str(key[0])] + [f"{c.removeprefix('sweep_')}={v}"
                                                  for c, v in zip(others, key[1:])])
                g = g.sort_values(col)
                ax.plot(g[col].astype(str), g.images_per_sec, marker="o", label=label)
            ax.set_xlabel(col.removeprefix("sweep_"))
            ax.set_ylabel("training images / s")
            _axes_style(ax, zero_y=True)
            ax.legend(fontsize=7)
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
        sizes = sorted(scaling.world_size.unique())
        base = min(sizes)
        a1.plot(sizes, [s / base for s in sizes], "k:", label="ideal")
        a2.axhline(1.0, color="k", linestyle=":", label="ideal")
        a1.set_title("speedup")
        a2.set_title("scaling efficiency")
        for ax in (a1, a2):
            ax.set_xlabel("processes (world size / replicas)")
            _axes_style(ax, integer_x=True, zero_y=True)
            ax.legend()
        fig.tight_layout()
        paths["scaling"] = out_dir / "scaling.png"
        fig.savefig(paths["scaling"], dpi=110)
        plt.close(fig)
    return paths


def aggregate(runs: dict, out_dir: Path, plots_dir: Path, keep_missing: bool = False,
              environment: Path | None = None) -> None:
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    plots_dir.mkdir(parents=True, exist_ok=True)
    states = ended_states(Path(run["metrics"]).parent.parent for run in runs.values()
                          if run.get("metrics"))  # one sacct for every run's killed tries
    rows = [summarize_run(name, run, lambda jobs: states) for name, run in runs.items()]
    bad = [r["run"] for r in rows if r["status"] not in (*FINISHED, "pruned")]
    if bad and not keep_missing:
        raise ValueError(f"runs without complete metrics: {bad} (use --keep-going to "
                         "summarise what finished)")
    df = pd.DataFrame(rows)
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df.reindex(columns=COLUMNS + extra)
    env = json.loads(environment.read_text()) if environment and environment.is_file() else {}
    tips = advice(df, env.get("cpu"))
    df["advice"] = df.run.map(advice_per_run(tips))
    df.to_csv(out_dir / "summary.csv", index=False, float_format="%.6g")
    histories = {r["run"]: read_jsonl(runs[r["run"]]["metrics"])
                 for r in rows if r["status"] in (*FINISHED, "incomplete", "pruned")}
    plot_all(df, histories, plots_dir)
    scaling = scaling_table(df)
    lines = ["# Advice", ""] + [f"- {t}" for t in tips]
    if not scaling.empty:
        lines += ["", "## Scaling", "", scaling.to_markdown(index=False, floatfmt=".2f")]
    (out_dir / "advice.md").write_text("\n".join(lines) + "\n")
    print(df[["run", "images_per_sec", "test_acc", "train_loss", "status"]].to_string(index=False))
    print("\n".join(tips))
