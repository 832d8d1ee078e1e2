"""From the user's config to the runs the workflow trains (no torch: the Snakefile imports it).

A run is one strategy with one combination of swept values; its name is derived from
those values (``ddp_ws2_bs256``), so it is readable and stable across invocations.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from .strategies.base import get_strategy

# sweep key -> (short name in run names, where it goes, strategies it applies to)
SWEEP_KEYS = {
    "batch_size": ("bs", "train", None),
    "lr": ("lr", "train", None),
    "model": ("", "train", None),
    "num_workers": ("nw", "train", None),
    "loader": ("", "train", None),
    "cpus_per_task": ("cpus", "resources", None),
    "world_size": ("ws", "distributed", ("ddp", "fsdp", "lightning")),
    "replicas": ("rep", "mps", ("mps",)),
}
DISTRIBUTED = ("ddp", "fsdp", "lightning")


@dataclass
class Run:
    name: str
    strategy: str
    swept: dict
    spec: dict                   # TrainConfig fields
    resources: dict              # scheduler request of each segment
    threads: int = 1             # cores the local scheduler reserves
    segment_epochs: list = field(default_factory=list)  # target epoch of segment k (1-based)

    def until_epoch(self, segment: int) -> int:
        if segment <= len(self.segment_epochs):
            return self.segment_epochs[segment - 1]
        return self.spec["epochs"]  # extra segments after early stops finish the run


def segment_targets(epochs: int, count: int) -> list[int]:
    count = max(1, min(count, epochs))
    return [math.ceil(k * epochs / count) for k in range(1, count + 1)]


def _label(key: str, value) -> str:
    short = SWEEP_KEYS[key][0]
    text = str(value).replace(".", "p").replace("-", "m")
    return f"{short}{text}" if short else text


def sweep_combos(strategy: str, sweep: dict) -> list[dict]:
    keys = [k for k in sweep if SWEEP_KEYS[k][2] is None or strategy in SWEEP_KEYS[k][2]]
    values = [sweep[k] if isinstance(sweep[k], list) else [sweep[k]] for k in keys]
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def build_runs(config: dict) -> dict[str, Run]:
    unknown = sorted(set(config.get("sweep") or {}) - set(SWEEP_KEYS))
    if unknown:
        raise ValueError(f"sweep: unknown key(s) {unknown}; sweepable: {sorted(SWEEP_KEYS)}")
    runs: dict[str, Run] = {}
    data_md5 = config["data"]["md5"] if config["data"]["source"] != "synthetic" else "synthetic"
    for strategy in config["strategies"]:
        cls = get_strategy(strategy)
        for swept in sweep_combos(strategy, config.get("sweep") or {}):
            sections = {"train": dict(config["train"]), "resources": dict(config["resources"]),
                        "distributed": dict(config["distributed"]), "mps": dict(config["mps"])}
            for key, value in swept.items():
                sections[SWEEP_KEYS[key][1]][key] = value
            name = "_".join([strategy] + [_label(k, v) for k, v in swept.items()])
            spec = dict(sections["train"], run=name, strategy=strategy, data_md5=data_md5)
            res = dict(sections["resources"])
            world = 1
            if strategy in DISTRIBUTED:
                d = sections["distributed"]
                world = int(d["world_size"])
                spec.update(world_size=world, device=d["device"], backend=d["backend"],
                            lr_scaling=d["lr_scaling"])
                res.update(nodes=d["nodes"], device=d["device"])
            elif strategy == "mps":
                world = int(sections["mps"]["replicas"])
                spec.update(world_size=world, backend=sections["mps"]["backend"],
                            lr_scaling=config["distributed"]["lr_scaling"])
            if spec.get("loader") == "torchvision" and not spec.get("num_workers"):
                spec["num_workers"] = int(res["cpus_per_task"])  # the seed: workers = cpus
            job = dict(cls.job_resources(world, res), runtime=int(res["runtime"]))
            targets = segment_targets(int(spec["epochs"]), int(config["segments"]["count"]))
            runs[name] = Run(name, strategy, swept, spec, job, segment_epochs=targets,
                             threads=int(res["cpus_per_task"]) * world)
    if not runs:
        raise ValueError("no runs: 'strategies' is empty")
    return runs
