"""Summary table, plots and advice from the metric histories of all runs (`cifarflow
aggregate`, the workflow's aggregate rule): table.py, plots.py and advice.py, put together
into results/summary.csv, results/plots/ and results/advice.md. No torch."""

from __future__ import annotations

import json
from pathlib import Path

from .. import slurm
from ..files import read_jsonl
from ..job.tries import ended_states
from ..slurm_queue import JobRecord
from .accounting import with_accounting
from .advice import advice, advice_per_run
from .plots import plot_all
from .study import describe, load_studies, plot_study, trial_columns
from .table import COLUMNS, FINISHED, scaling_table, summarize_run, was_cancelled


def aggregate(runs: dict, out_dir: Path, plots_dir: Path, keep_missing: bool = False,
              environment: Path | None = None, study: Path | None = None,
              results: Path | None = None) -> None:
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    plots_dir.mkdir(parents=True, exist_ok=True)
    states = ended_states(Path(run["metrics"]).parent.parent for run in runs.values()
                          if run.get("metrics"))  # one sacct for every run's killed tries
    rows = [summarize_run(name, run, lambda jobs: states) for name, run in runs.items()]
    cancelled = JobRecord(str(results or out_dir)).cancelled()  # scancel from outside: not retried
    for row in rows:
        if row["status"] not in (*FINISHED, "pruned") and \
                was_cancelled(row["run"], runs[row["run"]], cancelled):
            row["status"] = "cancelled"
    jobs = [job for row in rows for job in str(row.get("slurm_job_ids") or "").split()]
    with_accounting(rows, slurm.job_accounting(jobs))  # one sacct for every run's jobs
    bad = [r["run"] for r in rows if r["status"] not in (*FINISHED, "pruned")]
    if bad and not keep_missing:
        raise ValueError(f"runs without complete metrics: {bad} (use --keep-going to "
                         "summarise what finished)")
    if study is not None:  # sweep.search: each trial's study, number, round and state
        trials = trial_columns(study)
        for row in rows:
            row.update(trials.get(row["run"], {}))
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
    if study is not None:  # the study's best trials, importances and history (Optuna's own)
        lines += ["", "## Search", ""]
        for one in load_studies(study):
            lines += describe(one)
            lines += [f"![{p.stem}](plots/{p.name})" for p in plot_study(one, plots_dir)] + [""]
    (out_dir / "advice.md").write_text("\n".join(lines) + "\n")
    print(df[["run", "images_per_sec", "test_acc", "train_loss", "status"]].to_string(index=False))
    print("\n".join(tips))
