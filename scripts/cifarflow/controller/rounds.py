"""A search's rounds as the workflow walks them (sweep.search): each round's trials train
once the round is asked (the ask_trials checkpoint, wildcards study and round), and round
r's ask job first tells the study round r-1's results, so one `snakemake` invocation runs
all rounds, and a rerun finds each round's record and asks nothing again. SearchRounds
gates the trials and learns a round's (the WorkflowPlan's ``rounds``); SearchRules is what
the ask rule and the summary ask (its ``search_rules``). No torch (Optuna inside
functions, only where a search is told or asked)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Callable

from ..engine.checkpoints.files import read_manifest, read_metrics
from ..layout import round_record, study_journal
from .outputs import Outputs
from .plan import Run, plan_run, runs_at_once, search_round_values
from .search import Search
from .study_journal import outcome_of, read_record, tell_and_ask


class SearchRounds:
    """Which round a trial waits for, and the trials a later round learns from its record:
    planned like any run and handed to ``grow`` (the plan packs them and writes their
    specs)."""

    def __init__(self, search: Search | None, config: dict, runs: dict[str, Run], checkpoints,
                 grow: Callable[[dict[str, Run]], None], log, error: type[Exception]):
        self.search, self.config, self.runs, self.checkpoints = search, config, runs, checkpoints
        self.grow, self.log, self.error = grow, log, error
        self.results = config["results"]

    def gate(self, run: str) -> None:
        """A search trial trains once its round was asked: until then the ask checkpoint's
        "not run yet" exception, which schedules that job (and the round before)."""
        trial = self.runs[run]
        if not trial.round:
            return
        self.checkpoints.ask_trials.get(study=self.search.study_name(trial.strategy),
                                        round=trial.round)
        if not trial.sampled:
            self.learn_round(trial.strategy, trial.round)

    def learn_round(self, strategy: str, r: int) -> None:
        """A later TPE round's trials, from the record its ask job wrote."""
        study = self.search.study_name(strategy)
        values = search_round_values(self.search, strategy, r,
                                     read_record(round_record(self.results, study, r)))
        if values is None:
            raise self.error(f"{round_record(self.results, study, r)} lacks trials of round {r}: "
                             "remove it and run again to ask them")
        new = {}
        at_once = runs_at_once(self.config, self.search)
        for i, params in enumerate(values):
            run = plan_run(strategy, self.config, params,
                           name=self.search.trial_name(strategy, r, i), at_once=at_once)
            run.round = r
            new[run.name] = run
        self.grow(new)
        self.log.info(f"sweep.search: round {r} of {study} asked ({self.search.sampler}):\n"
                      + "\n".join(self.search.describe({n: run.swept for n, run in new.items()})))

    def describe(self) -> list[str]:
        """`snakemake -n`: what was sampled, a line per key, and which rounds wait."""
        if not self.search:
            return []
        s, lines = self.search, []
        for strategy in self.config["strategies"]:
            known = {n: r.swept for n, r in self.runs.items()
                     if r.strategy == strategy and r.sampled}
            later = sorted({r.round for r in self.runs.values()
                            if r.strategy == strategy and not r.sampled})
            lines.append(
                f"sweep.search: study {s.study_name(strategy)} ({study_journal(self.results)}): "
                f"{s.samples} trial(s) x {s.rounds} round(s), sampler {s.sampler} (seed "
                f"{s.seed}), {s.mode} {s.metric}; {len(known)} sampled:\n"
                + "\n".join(s.describe(known))
                + (f"\n  round(s) {', '.join(map(str, later))}: asked of the study once the "
                   "round before is told" if later else ""))
        return lines


class SearchRules:
    """The ask rule's attributes (its inputs, its study wildcard, its settings, its job),
    and what the summary waits for and passes on of a search."""

    def __init__(self, search: Search | None, strategies: list[str], outputs: Outputs, log):
        self.search, self.outputs, self.log = search, outputs, log
        self.studies = {search.study_name(s): s for s in strategies} if search else {}
        self.journal = study_journal(outputs.results)

    def inputs(self) -> dict:
        """The ask job's inputs, one function per trial index (each waits on its own chain,
        so the round's trials are scheduled at once): trial i of round r-1's final metrics,
        nothing for round 1; and round r-1's record."""
        def trial_metrics(wildcards, i):
            r = int(wildcards.round)
            if r == 1:
                return []
            name = self.search.trial_name(self.studies[wildcards.study], r - 1, i)
            return f"{self.outputs.final_segment(name)}/metrics.jsonl"

        inputs = {"previous": lambda wildcards: (
            round_record(self.outputs.results, wildcards.study, int(wildcards.round) - 1)
            if int(wildcards.round) > 1 else [])}
        for i in range(self.search.samples if self.search else 0):
            inputs[f"t{i}"] = lambda wildcards, i=i: trial_metrics(wildcards, i)
        return inputs

    def study_pattern(self) -> str:
        """The ask rule's study wildcard: the studies of this search (none without one)."""
        return "|".join(map(re.escape, self.studies)) or "(?!)"

    def setting(self, key: str):
        """A setting the ask jobs depend on (a param: changing it asks them again)."""
        return getattr(self.search, key) if self.search else None

    def study_args(self) -> str:
        """`cifarflow aggregate`'s study argument, where the sweep searches."""
        return f"--study {shlex.quote(self.journal)}" if self.search else ""

    def records(self) -> list[str]:
        """What the summary waits for: each study's record of round rounds+1, written once
        the last round was told."""
        if not self.search:
            return []
        return [round_record(self.outputs.results, study, self.search.rounds + 1)
                for study in self.studies]

    def tell_and_ask(self, wildcards, output) -> None:
        """The ask job: tell round r-1's trials their outcome, ask round r's."""
        strategy, r = self.studies[wildcards.study], int(wildcards.round)
        outcomes = {}
        if r > 1:
            for i in range(self.search.samples):
                name = self.search.trial_name(strategy, r - 1, i)
                segment = self.outputs.final_segment(name)
                outcomes[name] = outcome_of(
                    read_metrics(Path(segment)), self.search.metric,
                    self.outputs.chain.known_pruned_at(name),
                    read_manifest(Path(segment), verify=False).get("early_stop", ""))
        tell_and_ask(self.search, strategy, r, outcomes, self.journal, str(output[0]),
                     log=self.log.info)
