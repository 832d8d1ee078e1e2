"""The advice: what the measurements say, in the seed's spirit (small models on CPUs, no
idle GPU), per run where a tip is about one run (summary.csv's `advice` column, the verdict
`cifarflow show` prints) and about requests, pruning and scaling. No torch."""

from __future__ import annotations

from ..early_stop import hint_for
from ..jobfacts import ENV_BUILD_SHARE
from .table import FINISHED

MARGIN = 1.25  # what to request next time: the measured peak plus a quarter


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




def env_build_advice(df) -> list[str]:
    """Per strategy whose jobs built a venv (env.mode slurm_tmpdir): what share of each
    segment job the build took, and where it is above ENV_BUILD_SHARE, the ways to pay it
    less often."""
    if "env_build_share" not in df:
        return []
    tips = []
    for strategy, g in df.dropna(subset=["env_build_share"]).groupby("strategy"):
        share = g.env_build_share.mean()
        tip = (f"{strategy} ({len(g)} run(s)): building the job venv took "
               f"{g.env_build_s.mean():.0f} s, {share:.0%} of each segment job")
        if share > ENV_BUILD_SHARE:
            tip += (f": ask for fewer, longer segments (segments.count, resources.runtime of "
                    f"{g.env_build_s.mean() / ENV_BUILD_SHARE / 60:.0f} min or more; "
                    "resources.autosize keeps to that) or use env.mode venv with a venv built "
                    "once on a shared filesystem")
        tips.append(tip)
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
