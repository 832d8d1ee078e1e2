"""The chains' outputs as the rules and aggregation read them: a segment's output (pending
until its job ran: the training checkpoint's "not run yet" exception, which schedules
it), the chains of segments walked over them (chain.py), a run's final segment and
metrics, and the runs file aggregation reads. The WorkflowPlan's ``outputs``. No torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ..data import ARCHIVE_NAME, fetch_record
from ..config import data_identity
from ..data_folders import data_folder
from ..layout import RunPaths, segment_number
from .chain import Chain
from .pack_plan import Pack
from .plan import Run


class Outputs:
    """Where the plan's chains end, and what aggregation learns of each run. ``gate(run)``
    returns once the run may train (a search trial: once its round was asked)."""

    def __init__(self, config: dict, runs: dict[str, Run], packs: dict[str, Pack],
                 checkpoints, *, pending: type[Exception], gate: Callable[[str], None],
                 error: type[Exception]):
        self.runs, self.checkpoints, self.gate, self.error = runs, checkpoints, gate, error
        self.results = config["results"]
        self.data_dir = data_folder(self.results, data_identity(config["data"]))
        segments = config["segments"]
        self.chain = Chain(runs, packs, config["sweep"].get("prune"),
                           segments["count"] + segments["max_extra"], self.segment_output,
                           pending)

    def segment_output(self, run: str, k: int) -> str:
        """Segment k of a run, once its job (its own, or its pack's) ran: until then the
        checkpoint's "not run yet" exception, which schedules that job."""
        self.gate(run)
        train_rule = getattr(self.checkpoints, f"train_{self.runs[run].strategy}")
        if run in self.chain.pack_of:
            train_rule.get(pack=self.chain.pack_of[run], segment=k)
            return RunPaths(self.results, run).segment(k)
        return train_rule.get(run=run, segment=k).output.ckpt

    def final_segment(self, run: str) -> str:
        try:
            return self.chain.final_segment(run)
        except ValueError as exc:
            raise self.error(str(exc))

    def final_metrics(self) -> dict:
        """One input function per run: each waits on its own chain, so Snakemake schedules
        all runs at once (an unpack()ed function would wake them one at a time)."""
        return {run: (lambda wildcards, run=run: f"{self.final_segment(run)}/metrics.jsonl")
                for run in self.runs}

    def existing_metrics(self) -> dict[str, str]:
        """The most advanced finished segment of each run that has one."""
        found = {}
        for name in self.runs:
            segments = sorted(Path(RunPaths(self.results, name).root).glob(
                "segment-*/metrics.jsonl"), key=segment_number)
            if segments:
                found[name] = str(segments[-1])
        return found

    def runs_file(self, metrics) -> dict:
        """What aggregation needs to know about each run, metrics path included: `metrics`
        maps run names to their last metrics.jsonl (rule input or what exists)."""
        metrics = {name: str(metrics[name]) for name in self.runs if name in metrics.keys()}
        data = fetch_record(Path(self.data_dir, ARCHIVE_NAME))  # fetch-data's record
        return {
            name: {
                "strategy": run.strategy,
                "swept": run.swept,
                "spec": run.spec,
                "resources": run.resources,
                "segments": segment_number(metrics.get(name, "")),
                "metrics": metrics.get(name),
                "pruned_at": self.chain.known_pruned_at(name),
                "search_round": run.round or None,
                "planned_segments": len(run.segment_epochs),
                "logs": RunPaths(self.results, name).logs,
                "data": data if data and data.get("data_id") == run.config.data_id else None,
            }
            for name, run in self.runs.items()
        }

    def write_runs_file(self, metrics, path) -> None:
        """The runs file (runs_file), a file, not an argument: Linux caps one argument at
        128 KiB (~150 runs)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.runs_file(metrics), indent=1) + "\n")
