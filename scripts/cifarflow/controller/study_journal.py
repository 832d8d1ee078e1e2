"""The study of a search (``sweep.search``), in its journal file: what a trained trial tells
it (``Outcome``), the ask job's telling of round r-1 and asking of round r
(``tell_and_ask``), and the round's record that the plan reads back. Optuna is imported
inside functions (the controller side only). No torch."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .search import Search, quiet_optuna


@dataclass
class Outcome:
    """What a trained trial tells the study."""
    state: str                    # COMPLETE, PRUNED or FAIL
    value: float | None
    intermediate: dict            # epoch -> metric
    reason: str = ""


def outcome_of(history: list[dict], metric: str, pruned_at: int | None,
               early_stop: str = "") -> Outcome:
    """A run's outcome from its metrics (one record per epoch) and how it ended."""
    steps = {int(h["epoch"]): h.get(metric) for h in history}
    good = {k: float(v) for k, v in steps.items() if isinstance(v, (int, float))
            and math.isfinite(v)}
    last = steps[max(steps)] if steps else None
    if str(early_stop).startswith("diverged"):
        return Outcome("FAIL", None, good, early_stop)
    if last is None or not math.isfinite(float(last)):
        return Outcome("FAIL", None, good, f"{metric} of the last epoch is {last}")
    if pruned_at is not None:
        return Outcome("PRUNED", float(last), good, f"pruned after segment {pruned_at}")
    return Outcome("COMPLETE", float(last), good)


def open_study(journal: str, name: str, direction: str):
    from ..results.study import storage

    optuna = quiet_optuna()
    Path(journal).parent.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(storage=storage(journal), study_name=name,
                                direction="maximize" if direction == "max" else "minimize",
                                load_if_exists=True)
    return study


def tell_and_ask(search: Search, strategy: str, r: int, outcomes: dict[str, Outcome],
                 journal: str, record: str, log=print) -> dict:
    """The ask job of round r of a strategy's study: tell round r-1's trials (``outcomes``,
    by run name) that are not told yet, then ask round r's trials that are not asked yet
    (r <= rounds), and write the round's record last. Run again after an interruption it
    tells nothing twice and asks nothing twice."""
    optuna = quiet_optuna()
    State = optuna.trial.TrialState
    study = open_study(journal, search.study_name(strategy), search.mode)
    if not study.metric_names:
        study.set_metric_names([search.metric])
    by_run = {t.user_attrs.get("run"): t for t in study.get_trials(deepcopy=False)
              if t.user_attrs.get("run")}
    told = {}
    for name, outcome in outcomes.items():
        trial = by_run.get(name)
        if trial is None:
            raise ValueError(f"run {name} is not a trial of study {study.study_name} "
                             f"({journal}): was the journal removed? remove {Path(record).parent} too")
        if trial.state != State.RUNNING:
            told[name] = trial.state.name
            continue
        live = optuna.trial.Trial(study, trial._trial_id)
        for step, value in sorted(outcome.intermediate.items()):
            if step not in trial.intermediate_values:
                live.report(value, step)
        if outcome.reason:
            live.set_user_attr("reason", outcome.reason)
        if outcome.state == "COMPLETE":
            study.tell(trial.number, outcome.value)
        else:
            study.tell(trial.number, state=getattr(State, outcome.state))
        told[name] = outcome.state
        log(f"told trial {trial.number} ({name}): {outcome.state}"
            + (f" {search.metric} {outcome.value:.4g}" if outcome.value is not None else "")
            + (f" ({outcome.reason})" if outcome.reason else ""))
    trials = {}
    if r <= search.rounds:
        dists = search.distributions()
        fixed = search.planned(r) if search.predetermined(r) else None
        for i in range(search.samples):
            name = search.trial_name(strategy, r, i)
            trial = by_run.get(name)
            if trial is None or trial.state == State.WAITING:
                if fixed is not None:
                    if trial is None:
                        study.enqueue_trial(fixed[i], user_attrs={"run": name, "round": r,
                                                                  "index": i})
                    asked = study.ask(dists)
                else:
                    study.sampler = search.adaptive_sampler(r, i)
                    asked = study.ask(dists)
                    for key, value in {"run": name, "round": r, "index": i}.items():
                        asked.set_user_attr(key, value)
                log(f"asked trial {asked.number} ({name}): {asked.params}")
                trials[name] = {"number": asked.number, "index": i, "params": asked.params}
            else:
                trials[name] = {"number": trial.number, "index": i, "params": trial.params}
    from ..engine.checkpoints.files import atomic_write_text

    Path(record).parent.mkdir(parents=True, exist_ok=True)
    data = {"study": search.study_name(strategy), "round": r, "sampler": search.sampler,
            "trials": trials, "told": told}
    atomic_write_text(Path(record), json.dumps(data, indent=1) + "\n")
    return data


def read_record(record: str) -> dict | None:
    path = Path(record)
    return json.loads(path.read_text()) if path.is_file() else None
