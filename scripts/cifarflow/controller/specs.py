"""Each run's spec.json: its typed config, handed to every segment as one file, written
where Snakemake plans (the main process), and only when it changed: its time stamp says
when the run's config last changed, so the finished segments are trained again. No torch."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..layout import RunPaths

# what a run's spec may change while its finished segments stand (segments.elastic)
ELASTIC_FIELDS = {"world_size", "nodes"}
# what a spec may gain or change while its finished segments stand, since no weight it
# trains changes: what a run reports (tensorboard), where it may resume from (the interval
# of checkpoint_interval_s: auto, which follows the sweep's size) and which finished weights
# it keeps on disk (keep_weights: auto becomes last when a sweep grows past a few runs)
UNTRAINED_FIELDS = {"tensorboard", "checkpoint_interval_s", "keep_weights"}


def write_specs(runs, results: str, log) -> None:
    """The specs of these runs (a job per run would cost one Snakemake start each). A new
    world size under segments.elastic keeps the time stamp: the finished segments stand and
    the next resumes from them; so does a change of what trains no weight
    (UNTRAINED_FIELDS)."""
    for run in runs:
        if not run.sampled:
            continue  # a later search round's trial: written once its round is asked
        spec = Path(RunPaths(results, run.name).spec)
        old = spec.read_text() if spec.is_file() else None
        if old == run.config.to_json():
            continue  # its time stamp keeps saying when the config last changed
        stamp = spec.stat() if old else None
        run.config.write(spec)
        before, now = json.loads(old) if old else {}, run.config.to_dict()
        changed = {key for key in now if before.get(key) != now[key]}
        if before and changed <= UNTRAINED_FIELDS:
            os.utime(spec, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
            continue
        if not before or before.get("world_size") == now["world_size"]:
            continue
        resize = f"run {run.name}: world size {before['world_size']} -> {now['world_size']}"
        if run.config.elastic and changed <= ELASTIC_FIELDS:
            os.utime(spec, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
            log.info(f"{resize} (segments.elastic): its finished segments stand, the next "
                     "resumes from them at an epoch boundary")
        else:
            log.info(f"{resize}: the run is trained again from its first segment"
                     + ("" if run.config.elastic else
                        " (segments.elastic: true would go on from the finished ones)"))
