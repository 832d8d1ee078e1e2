"""The plots (PNG): throughput against accuracy, the learning curves, scaling. Pruned runs
are drawn dashed and grey-hatched; a big sweep's best runs only, readable. No torch."""

from __future__ import annotations

from pathlib import Path

from .table import FINISHED, scaling_table

MAX_BARS, MAX_LEGEND = 50, 20  # plots of big sweeps stay readable


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
