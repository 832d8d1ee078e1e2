"""What a user reads first after a run (`cifarflow show`, the end of `make run`): the
columns that matter, best test accuracy first, a big sweep's top runs and a count of the
rest, and where the full table, the plots, the advice and the report are. No torch."""

from __future__ import annotations

import math
import shutil
import textwrap
from pathlib import Path

from .study import journal_of

# (header, summary.csv column, format); the advice's verdict for the run comes last
COLUMNS = [("run", "run", str), ("strategy", "strategy", str),
           ("test_acc", "test_acc", lambda v: f"{v:.3f}"),
           ("images/s", "images_per_sec", lambda v: f"{v:,.0f}"),
           ("wall", "wall_s", lambda v: duration(v)), ("status", "status", str),
           ("data", "data", str)]
DIGEST = ("weights_sha256", "weights_sha256", str)  # with --digest: the final weights' own
ADVICE_MIN_WIDTH = 24  # the verdict keeps at least this much of a narrow terminal
GENERAL_TIPS = 5  # tips about no one run (requests, pruning) printed below the table


def duration(seconds: float) -> str:
    """12.3s, 4m05s, 2h03m: wall times and the time left, readable at a glance."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def summary_path(results: Path) -> Path:
    """results/ (or results/partial/), or a summary.csv itself."""
    path = Path(results)
    path = path if path.suffix == ".csv" else path / "summary.csv"
    if not path.is_file():
        raise ValueError(f"no {path}: run the workflow first (make run, or snakemake --cores N), "
                         "or `snakemake --cores 1 summarize_partial` after a partial run, then "
                         f"`cifarflow show {path.parent}/partial`")
    return path


def cell(value, fmt) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return fmt(value)


def table(rows: list[list[str]], width: int) -> list[str]:
    """Left-aligned columns; the last (the verdict) cut to the terminal's width."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    room = max(ADVICE_MIN_WIDTH, width - sum(w + 2 for w in widths))
    lines = []
    for r in rows:
        verdict = r[-1] if len(r[-1]) <= room else r[-1][:room - 1] + "…"
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + verdict)
    return [line.rstrip() for line in lines]


def status_counts(df) -> str:
    counts = df.status.fillna("missing").value_counts()
    order = sorted(counts.index, key=lambda s: (-counts[s], s))
    return ", ".join(f"{counts[s]} {s}" for s in order)


def general_tips(advice: Path, df) -> list[str]:
    """advice.md's tips about no one run (requests, pruning): those not in a run's `advice`
    (aggregate.advice_per_run: its tips, joined, each without the run's name in front)."""
    if not advice.is_file():
        return []
    own = set()
    for run, text in zip(df.run, df["advice"] if "advice" in df else []):
        for tip in str(text).split(" | ") if isinstance(text, str) else []:
            own.update((tip, f"{run}: {tip}"))
    tips = [line[2:] for line in advice.read_text().splitlines() if line.startswith("- ")]
    return [t for t in tips if t not in own]


def data_label(source, md5) -> str:
    """A run's data at a glance: its source and the start of the tarball's md5."""
    source = "" if not isinstance(source, str) else source
    md5 = md5[:8] if isinstance(md5, str) else ""
    return f"{source} {md5}".strip()


def synthetic_warning(df) -> list[str]:
    """A line where runs trained in Slurm jobs on the synthetic demo data: their accuracy
    says nothing of CIFAR-10 (a first day on a cluster once trained only that)."""
    missing = [None] * len(df)
    synthetic = [run for run, source, jobs in zip(df.run, df.get("data_source", missing),
                                                  df.get("slurm_job_ids", missing))
                 if source == "synthetic" and isinstance(jobs, str) and jobs.strip()]
    if not synthetic:
        return []
    return [f"WARNING: {len(synthetic)} run(s) trained in Slurm jobs on synthetic data "
            f"(data.source synthetic: generated images, not CIFAR-10), {synthetic[0]} "
            f"among them: for the real set, data.source: download (docs/slurm.md)"]


def show(results: Path, top: int = 20, width: int | None = None, digest: bool = False) -> str:
    """The text `cifarflow show` prints; `top` runs (0: all), by test accuracy; ``digest``:
    each run's weights_sha256 in a column of its own."""
    import pandas as pd

    path = summary_path(results)
    df = pd.read_csv(path)
    columns = len(df.columns)  # summary.csv's own, before the data label below
    width = width or shutil.get_terminal_size((120, 24)).columns
    missing = [None] * len(df)
    df["data"] = [data_label(source, md5) for source, md5 in
                  zip(df.get("data_source", missing), df.get("data_md5", missing))]
    ranked = df.sort_values(["test_acc", "run"], ascending=[False, True], na_position="last")
    shown = ranked if top <= 0 else ranked.head(top)
    verdicts = shown["advice"] if "advice" in shown else [None] * len(shown)
    columns_shown = COLUMNS + ([DIGEST] if digest else [])
    rows = [[h for h, _, _ in columns_shown] + ["advice"]]
    for (_, row), verdict in zip(shown.iterrows(), verdicts):
        rows.append([cell(row.get(col), fmt) for _, col, fmt in columns_shown]
                    + [cell(verdict, lambda v: str(v).split(" | ")[0])])
    n = len(df)
    lines = [f"{n} run{'s' if n != 1 else ''}: {status_counts(df)}"
             + (f"; the {len(shown)} most accurate:" if len(shown) < n else "")]
    lines += synthetic_warning(df) + [""]
    lines += table(rows, width)
    if len(shown) < n:
        lines.append(f"... and {n - len(shown)} more (cifarflow show --top 0 {path.parent}: all)")
    folder = path.parent
    advice = folder / "advice.md"
    tips = general_tips(advice, df)
    if tips:
        lines.append("")
        lines += [wrapped for t in tips[:GENERAL_TIPS]
                  for wrapped in textwrap.wrap(t, width, initial_indent="- ",
                                               subsequent_indent="  ")]
        if len(tips) > GENERAL_TIPS:
            lines.append(f"- ... {len(tips) - GENERAL_TIPS} more in {advice}")
    journal = journal_of(folder)
    if journal is not None:  # sweep.search: each study's best trials and their parameters
        from .study import describe, load_studies

        for study in load_studies(journal):
            lines += [""] + [line.lstrip("# ") for line in describe(study, n=3) if line]
        lines.append(f"study:  {journal} (cifarflow dashboard {folder})")
    plots = sorted(p.name for p in (folder / "plots").glob("*.png"))
    lines += ["", f"full table ({columns} columns): {path}"]
    if plots:
        lines.append(f"plots:  {folder / 'plots'}/ ({', '.join(plots)})")
    if advice.is_file():
        lines.append(f"advice: {advice}")
    lines.append(f"report: snakemake --report {folder / 'report.html'}   "
                 "curves: make tensorboard")
    return "\n".join(lines)
