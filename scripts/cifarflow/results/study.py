"""The search's study, read back (sweep.search): the journal file's storage, the best trials
with their parameters (`cifarflow show`), the optimization history and the parameter
importances (Optuna's own analysis) for the summary, and `cifarflow dashboard`. Optuna is
imported inside functions. No torch."""

from __future__ import annotations

import math
from pathlib import Path

from ..layout import study_journal


def storage(journal: str):
    """An Optuna JournalStorage in one file, locked with a lock file created with O_EXCL
    (JournalFileOpenLock), which works on a cluster's shared filesystem (NFS, Lustre), where
    symlink or flock locks may not."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    return JournalStorage(JournalFileBackend(str(journal), lock_obj=JournalFileOpenLock(str(journal))))


def journal_of(results) -> Path | None:
    """results/search/study.journal, or None where the sweep did not search."""
    path = Path(study_journal(str(results)))
    return path if path.is_file() else None


def load_studies(journal) -> list:
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    store = storage(journal)
    return [optuna.load_study(study_name=s.study_name, storage=store)
            for s in optuna.get_all_study_summaries(store, include_best_trial=False)]


def best_trials(study, n: int = 5) -> list:
    """The n best finished trials (COMPLETE), best first."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and math.isfinite(t.value)]
    maximize = study.direction.name == "MAXIMIZE"
    return sorted(done, key=lambda t: (-t.value if maximize else t.value, t.number))[:n]


def importances(study) -> dict[str, float]:
    """Optuna's parameter importances (fANOVA) over the finished trials; empty where too few
    finished or only one parameter varies."""
    import optuna

    try:
        return optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError):
        return {}


def state_counts(study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts


def describe(study, n: int = 5) -> list[str]:
    """Markdown lines: the study's trials by state, its best trials and parameters, the
    parameter importances."""
    metric = (study.metric_names or ["value"])[0]
    counts = state_counts(study)
    lines = [f"### Study {study.study_name}", "",
             f"{sum(counts.values())} trials: "
             + ", ".join(f"{n_} {state.lower()}" for state, n_ in sorted(counts.items()))
             + f"; {study.direction.name.lower()} {metric}", ""]
    best = best_trials(study, n)
    if best:
        lines += [f"Best trials ({metric}):", ""]
        for t in best:
            params = ", ".join(f"{k}={fmt(v)}" for k, v in sorted(t.params.items()))
            lines.append(f"- trial {t.number} ({t.user_attrs.get('run', '')}): {fmt(t.value)}: "
                         f"{params}")
        lines.append("")
    imp = importances(study)
    if imp:
        lines += ["Parameter importances (fANOVA): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in imp.items()), ""]
    return lines


def fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def plot_study(study, plots_dir: Path) -> list[Path]:
    """The optimization history and the parameter importances, Optuna's matplotlib plots,
    as plots/search-<study>-history.png and -importance.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as oplt

    written = []
    plots = [("history", oplt.plot_optimization_history)]
    if importances(study):
        plots.append(("importance", oplt.plot_param_importances))
    for name, plot in plots:
        try:
            ax = plot(study)
        except (ValueError, RuntimeError):
            continue
        path = Path(plots_dir) / f"search-{study.study_name}-{name}.png"
        ax.figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(ax.figure)
        written.append(path)
    return written


def trial_columns(journal) -> dict[str, dict]:
    """summary.csv's columns of each searched run: its study, trial number and state."""
    out = {}
    for study in load_studies(journal):
        for t in study.get_trials(deepcopy=False):
            run = t.user_attrs.get("run")
            if run:
                out[run] = {"study": study.study_name, "trial": t.number,
                            "search_round": t.user_attrs.get("round"),
                            "trial_state": t.state.name}
    return out


def say_now(text: str) -> None:
    print(text, flush=True)  # a pipe or a file shows the port at once, not at exit


def serve_dashboard(journal, host: str, port: int | None, say=say_now, serve=True):
    """optuna-dashboard over the journal file, until interrupted, on ``port`` or, where none
    is given, a free one the system picks (a login node is shared by hundreds of users):
    says where, and the `ssh -L` line that reaches it from a laptop. The server."""
    import getpass
    import socket
    from wsgiref.simple_server import make_server

    from optuna_dashboard import wsgi

    server = make_server(host, port or 0, wsgi(storage(journal)))
    port = server.server_port
    say(f"cifarflow dashboard: {journal} on http://{host}:{port}/dashboard/ (Ctrl-C stops it)\n"
        f"from a laptop: ssh -L {port}:localhost:{port} {getpass.getuser()}@{socket.getfqdn()}"
        f"  then open http://localhost:{port}/dashboard/")
    if serve:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return server
