"""From the user's config to the runs the workflow trains (no torch: the Snakefile imports it).

A run is one strategy with one combination of swept values; its name is derived from
those values (``ddp_ws2_bs256``), so it is readable and stable across invocations. Each
run is planned once, here, into a typed ``TrainConfig``; what a strategy adds (world size,
process settings, scheduler request, launcher) comes from its class.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ..config import TrainConfig, data_identity, resolve_augment
from .prune import check_prune
from .search import Search
from .sites import current as current_site
from .sizing import Policy
from .storage import checkpoint_interval_s
from ..engine.strategies import Strategy, get_strategy, registered

# sweep key -> (short name in run names, config section it overrides), for every strategy;
# a strategy adds its own (Strategy.sweep_keys), of a section it reads (config_sections)
COMMON_SWEEP_KEYS = {
    "batch_size": ("bs", "train"),
    "lr": ("lr", "train"),
    "momentum": ("mom", "train"),
    "weight_decay": ("wd", "train"),
    "optimizer": ("", "train"),
    "scheduler": ("", "train"),
    "seed": ("seed", "train"),
    "model": ("", "train"),
    "num_workers": ("nw", "train"),
    "loader": ("", "train"),
    "cpus_per_task": ("cpus", "resources"),
}
COMMON_SECTIONS = ("train", "resources")


class PlanError(Exception):
    """A plan that cannot run; the workflow hands in Snakemake's WorkflowError instead."""


def sweep_keys() -> dict:
    keys = dict(COMMON_SWEEP_KEYS)
    for cls in registered().values():
        keys.update(cls.sweep_keys)
    return keys


def config_sections() -> tuple:
    """The sections a run's plan reads: the common ones, segments, and the strategies'."""
    extra = sorted({s for cls in registered().values() for s in cls.config_sections})
    return COMMON_SECTIONS + ("segments",) + tuple(extra)


KEEP_ALL_RUNS = 8  # segments.keep_weights auto keeps every segment's weights up to this many runs


@dataclass
class Run:
    name: str
    strategy: str
    swept: dict
    config: TrainConfig
    resources: dict              # scheduler request of each segment
    threads: int = 1             # cores the local scheduler reserves
    policy: Policy | None = None  # how a segment's request is sized (autosize, retries)
    segment_epochs: list = field(default_factory=list)  # target epoch of segment k (1-based)
    round: int = 0               # sweep.search: its round (1..rounds); 0: a grid run
    sampled: bool = True         # False: a later TPE round's trial, not asked yet

    @property
    def spec(self) -> dict:
        return self.config.to_dict()

    @property
    def strategy_class(self) -> type[Strategy]:
        return get_strategy(self.strategy)

    def until_epoch(self, segment: int) -> int:
        if segment <= len(self.segment_epochs):
            return self.segment_epochs[segment - 1]
        return self.config.epochs  # extra segments after early stops finish the run


def segment_targets(epochs: int, count: int) -> list[int]:
    count = max(1, min(count, epochs))
    return [math.ceil(k * epochs / count) for k in range(1, count + 1)]


def _label(key: str, value) -> str:
    short = sweep_keys()[key][0]
    if key == "model" and ":" in str(value):
        value = str(value).split(":")[1]  # package.module:factory -> factory
    text = str(value).replace(".", "p").replace("-", "m")
    return f"{short}{text}" if short else text


def sweep_combos(cls: type[Strategy], sweep: dict) -> list[dict]:
    sections = COMMON_SECTIONS + tuple(cls.config_sections)
    keys = [k for k in sweep if sweep_keys()[k][1] in sections]
    values = [sweep[k] if isinstance(sweep[k], list) else [sweep[k]] for k in keys]
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def runs_at_once(config: dict, search: Search | None) -> int:
    """The runs the plan trains at once (train.checkpoint_interval_s auto): a round's, packed
    or not, since its jobs may all be queued at once; every run of a grid sweep."""
    if search:
        return search.samples * len(config["strategies"])
    sweep = {k: v for k, v in (config.get("sweep") or {}).items() if k != "prune"}
    return sum(len(sweep_combos(get_strategy(s), sweep)) for s in config["strategies"])


def plan_run(strategy: str, config: dict, swept: dict, name: str | None = None,
             at_once: int = 1) -> Run:
    """One run of a schema-complete config (snakemake's validate, or ``with_defaults``);
    a grid run is named from its values, a search's trial is given its name; ``at_once``:
    the runs the plan trains at once (runs_at_once)."""
    cls = get_strategy(strategy)
    sections = {name: dict(config[name]) for name in config_sections()}
    for key, value in swept.items():
        sections[sweep_keys()[key][1]][key] = value
    name = name or "_".join([strategy] + [_label(k, v) for k, v in swept.items()])
    train, res = sections["train"], sections["resources"]
    if train["loader"] == "torchvision" and not train["num_workers"]:
        train["num_workers"] = int(res["cpus_per_task"])  # the seed: workers = cpus
    world = cls.world_size(sections)
    cfg = TrainConfig.from_dict({
        **train, "augment": resolve_augment(train["model"], train["augment"]),
        "checkpoint_interval_s": checkpoint_interval_s(train, at_once),
        "tta": config["eval"]["tta"], "run": name, "strategy": strategy, "world_size": world,
        **cls.process_settings(sections), "data_id": data_identity(config["data"]),
        "margin_s": float(sections["segments"]["margin_s"]),
        "budget_s": float(sections["segments"]["budget_s"]),
        "elastic": bool(sections["segments"]["elastic"]),
        "keep_weights": sections["segments"]["keep_weights"]})
    site = current_site()  # a site's minimum walltime bounds every runtime from below
    if refusal := site.too_short(int(res["runtime"]), "resources.runtime"):
        raise ValueError(refusal)
    job = dict(cls.job_resources(cfg, res), runtime=int(res["runtime"]))
    per_node = job["mem_mb"] // int(res["mem_mb"])  # processes on a node
    policy = Policy(job["mem_mb"], job["runtime"], bool(res["autosize"]),
                    float(res["autosize_margin"]), float(res["oom_factor"]),
                    int(res["max_mem_mb"] or 4 * int(res["mem_mb"])) * per_node, cfg.margin_s,
                    site.runtime_floor(int(res["autosize_min_runtime"])))
    return Run(name, strategy, swept, cfg, job,
               segment_epochs=segment_targets(cfg.epochs, int(sections["segments"]["count"])),
               threads=int(res["cpus_per_task"]) * world, policy=policy)


def planned_runs(config: dict) -> int:
    """How many runs the config plans (a search: every trial of every round)."""
    sweep = {k: v for k, v in (config.get("sweep") or {}).items() if k != "prune"}
    search = Search.from_sweep(sweep, sweep_item_schemas())
    if search:
        return len(config["strategies"]) * search.rounds * search.samples
    known = {k: v for k, v in sweep.items() if k in sweep_keys()}  # build_runs names the rest
    return sum(len(sweep_combos(get_strategy(s), known)) for s in config["strategies"]
               if s in registered())


def settle_keep_weights(config: dict) -> dict:
    """segments.keep_weights auto: all for up to KEEP_ALL_RUNS runs, last for a larger
    sweep (whose checkpoints would fill a quota); all and last as they are."""
    segments = config["segments"]
    if segments["keep_weights"] != "auto":
        return config
    keep = "all" if planned_runs(config) <= KEEP_ALL_RUNS else "last"
    return {**config, "segments": {**segments, "keep_weights": keep}}


def build_runs(config: dict) -> dict[str, Run]:
    config = settle_keep_weights(config)
    unknown = sorted(set(config["strategies"]) - set(registered()))
    if unknown:
        raise ValueError(f"unknown strateg{'y' if len(unknown) == 1 else 'ies'} "
                         f"{', '.join(map(repr, unknown))}; known: {', '.join(sorted(registered()))}")
    sweep = dict(config.get("sweep") or {})
    check_prune(sweep.get("prune"),
                min(int(config["segments"]["count"]), int(config["train"]["epochs"])))
    search = Search.from_sweep(sweep, sweep_item_schemas())
    if search:
        return search_runs(config, search)
    sweep.pop("prune", None)
    unknown = sorted(set(sweep) - set(sweep_keys()))
    if unknown:
        raise ValueError(f"sweep: unknown key(s) {unknown}; sweepable: {sorted(sweep_keys())}")
    runs: dict[str, Run] = {}
    at_once = runs_at_once(config, None)
    for strategy in config["strategies"]:
        for swept in sweep_combos(get_strategy(strategy), sweep):
            run = plan_run(strategy, config, swept, at_once=at_once)
            runs[run.name] = run
    if not runs:
        raise ValueError("no runs: 'strategies' is empty")
    return runs


def sweep_item_schemas() -> dict:
    """The schema of one value of each list a sweep crosses (what a search may sample)."""
    from ..schema import schema

    props = schema()["properties"]["sweep"]["properties"]
    return {key: node["items"] for key, node in props.items() if "items" in node}


def search_runs(config: dict, search: Search) -> dict[str, Run]:
    """The trials of a search, every round of every strategy, in (strategy, round, index)
    order: sampled where known (the config alone, or the round's record once asked),
    else placeholders of the base config until their round is asked."""
    from ..layout import round_record
    from .study_journal import read_record

    runs: dict[str, Run] = {}
    at_once = runs_at_once(config, search)
    for strategy in config["strategies"]:
        for r in range(1, search.rounds + 1):
            record = read_record(round_record(config["results"], search.study_name(strategy), r))
            values = search_round_values(search, strategy, r, record)
            for i in range(search.samples):
                name = search.trial_name(strategy, r, i)
                run = plan_run(strategy, config, values[i] if values else {}, name=name,
                               at_once=at_once)
                run.round, run.sampled = r, values is not None
                runs[name] = run
    return runs


def search_round_values(search: Search, strategy: str, r: int,
                        record: dict | None) -> list[dict] | None:
    """Round r's values: its record's where it was asked (a job's plan reads them, nothing
    is sampled again), else the config's own (search.planned), else None (a TPE round not
    asked yet)."""
    if record:
        names = [search.trial_name(strategy, r, i) for i in range(search.samples)]
        if all(n in record["trials"] for n in names):
            return [record["trials"][n]["params"] for n in names]
    return search.planned(r) if search.predetermined(r) else None


def check_user_models(runs) -> dict[str, tuple[int, int]]:
    """Import, build and try every ``package.module:factory`` model (imports torch: only
    where a config names such a model; check_model remembers what it checked); the sizes
    (parameter and buffer bytes) of each, for the storage estimate."""
    sizes = {}
    for run in runs:
        if ":" in run.config.model:
            from ..engine.models import check_model

            card = check_model(run.config.model, run.config.model_args, run.config.channels_last)
            sizes[run.config.model] = card.sizes
    return sizes
