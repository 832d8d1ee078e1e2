"""A search's rounds as the workflow walks them (sweep.search): each round's trials train
once the round is asked (the ask_trials checkpoint, wildcards study and round), and round
r's ask job first tells the study round r-1's results, so one `snakemake` invocation runs
all rounds, and a rerun finds each round's record and asks nothing again. A part of the
WorkflowPlan. No torch (Optuna inside functions, only where a search is told or asked)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ..engine.checkpoint import read_manifest, read_metrics
from ..layout import round_record, study_journal
from .pack_plan import plan_packs
from .plan import plan_run, runs_at_once, search_round_values
from .search import Search
from .study_journal import outcome_of, read_record, tell_and_ask


class SearchRounds:
    """The WorkflowPlan's search: which round a trial waits for, what each ask job tells
    and asks, and the trials a later round learns from its record."""

    def init_search(self, search: Search | None) -> None:
        self.search = search
        self.studies = ({search.study_name(s): s for s in self.config["strategies"]}
                        if search else {})
        self.journal = study_journal(self.results)

    def round_gate(self, run: str) -> None:
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
        """A later TPE round's trials, from the record its ask job wrote: planned like any
        run, packed (replacing the placeholders' provisional packs), their specs written."""
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
            new[run.name] = self.runs[run.name] = run
        old = {p.name for p in self.packs.values() if set(p.members) & set(new)}
        packs = plan_packs(new, self.config["pack"])
        self.chain.add_packs(packs, old)
        if getattr(self, "main_process", False):
            self.write_specs(new.values())
        self.log.info(f"sweep.search: round {r} of {study} asked ({self.search.sampler}):\n"
                      + "\n".join(self.search.describe({n: run.swept for n, run in new.items()})))

    # ---- the ask rule
    def round_inputs(self) -> dict:
        """The ask job's inputs, one function per trial index (each waits on its own chain,
        so the round's trials are scheduled at once): trial i of round r-1's final metrics,
        nothing for round 1; and round r-1's record."""
        def trial_metrics(wildcards, i):
            r = int(wildcards.round)
            if r == 1:
                return []
            name = self.search.trial_name(self.studies[wildcards.study], r - 1, i)
            return f"{self.final_segment(name)}/metrics.jsonl"

        inputs = {"previous": lambda wildcards: (
            round_record(self.results, wildcards.study, int(wildcards.round) - 1)
            if int(wildcards.round) > 1 else [])}
        for i in range(self.search.samples if self.search else 0):
            inputs[f"t{i}"] = lambda wildcards, i=i: trial_metrics(wildcards, i)
        return inputs

    def study_pattern(self) -> str:
        """The ask rule's study wildcard: the studies of this search (none without one)."""
        return "|".join(map(re.escape, self.studies)) or "(?!)"

    def search_setting(self, key: str):
        """A setting the ask jobs depend on (a param: changing it asks them again)."""
        return getattr(self.search, key) if self.search else None

    def study_args(self) -> str:
        """`cifarflow aggregate`'s study argument, where the sweep searches."""
        return f"--study {shlex.quote(self.journal)}" if self.search else ""

    def study_records(self) -> list[str]:
        """What the summary waits for: each study's record of round rounds+1, written once
        the last round was told."""
        if not self.search:
            return []
        return [round_record(self.results, study, self.search.rounds + 1) for study in self.studies]

    def tell_and_ask(self, wildcards, output) -> None:
        """The ask job: tell round r-1's trials their outcome, ask round r's."""
        strategy, r = self.studies[wildcards.study], int(wildcards.round)
        outcomes = {}
        if r > 1:
            for i in range(self.search.samples):
                name = self.search.trial_name(strategy, r - 1, i)
                segment = self.final_segment(name)
                outcomes[name] = outcome_of(
                    read_metrics(Path(segment)), self.search.metric,
                    self.chain.known_pruned_at(name),
                    read_manifest(Path(segment), verify=False).get("early_stop", ""))
        tell_and_ask(self.search, strategy, r, outcomes, self.journal, str(output[0]),
                     log=self.log.info)

    def describe_search(self) -> None:
        """`snakemake -n`: what was sampled, a line per key, and which rounds wait."""
        if not self.search:
            return
        s = self.search
        for strategy in self.config["strategies"]:
            known = {n: r.swept for n, r in self.runs.items()
                     if r.strategy == strategy and r.sampled}
            later = sorted({r.round for r in self.runs.values()
                            if r.strategy == strategy and not r.sampled})
            self.log.info(
                f"sweep.search: study {s.study_name(strategy)} ({self.journal}): {s.samples} "
                f"trial(s) x {s.rounds} round(s), sampler {s.sampler} (seed {s.seed}), "
                f"{s.mode} {s.metric}; {len(known)} sampled:\n"
                + "\n".join(s.describe(known))
                + (f"\n  round(s) {', '.join(map(str, later))}: asked of the study once the "
                   "round before is told" if later else ""))
