"""Hyper-parameter search (``sweep.search``): a search space of distributions, Optuna's
samplers (random, QMC Sobol, TPE), rounds told to a study kept in a journal file.

Reproducible and stable plans: trial i of round r of a random search draws from its own
RandomSampler seeded from (seed, r, i); a QMC round is the prefix of one scrambled Sobol
sequence seeded from (seed, r); TPE's first round is random like a random search's. So
the same config plans the same trials anywhere, and raising ``samples`` appends trials
without changing the earlier ones. TPE's later rounds are asked of the study once the
round before was told, by the workflow's ask job (study_journal.py's tell_and_ask), and
recorded in ``results/search/<study>/round-<r>.json``: a rerun reads them back and asks
nothing twice.

Optuna is imported inside functions (the controller side only: jobs never import it).
No torch.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass

from .prune import METRICS

# the keys a search may sample: a run's training hyper-parameters (those that change neither
# its request nor its launcher, so a trial is planned like any run of its strategy)
SEARCHABLE = ("lr", "momentum", "weight_decay", "batch_size", "optimizer", "scheduler", "model",
              "seed")
INTEGER_KEYS = ("batch_size", "seed")
KINDS = ("log_uniform", "uniform", "int", "log_int", "choice")
SAMPLERS = ("random", "qmc", "tpe")


def derive_seed(*parts) -> int:
    """A 32-bit seed that depends on every part: trial i of round r draws alone."""
    text = ":".join(str(p) for p in parts)
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def quiet_optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def check_range(key: str, kind: str, values, item_schema: dict) -> None:
    """One distribution of the space: its shape, its bounds, and each bound (or choice) as
    the grid's list of that key accepts it (the schema's items)."""
    where = f"sweep.search.space.{key}"
    if kind == "choice":
        if not values:
            raise ValueError(f"{where}: choice is empty; give at least one value")
    else:
        if not isinstance(values, list) or len(values) != 2 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ValueError(f"{where}: {kind} takes [low, high], two numbers (got {values!r})")
        low, high = values
        if not low < high:
            raise ValueError(f"{where}: {kind} [{low}, {high}]: low must be below high")
        if kind.startswith("log") and low <= 0:
            raise ValueError(f"{where}: {kind} [{low}, {high}]: a log range must lie above 0 "
                             "(use uniform or int to include 0)")
        if kind in ("int", "log_int") and not all(float(v).is_integer() for v in values):
            raise ValueError(f"{where}: {kind} [{low}, {high}] takes integers")
        if key in INTEGER_KEYS and kind not in ("int", "log_int"):
            raise ValueError(f"{where}: {key} takes integers: use int, log_int or choice")
    import jsonschema

    for value in values:
        try:
            jsonschema.validate(value, item_schema)
        except jsonschema.ValidationError as exc:
            raise ValueError(f"{where}: {value!r} is not a value of {key} ({exc.message})")


@dataclass(frozen=True)
class Search:
    """The search of one config: its space, sampler, rounds and metric."""
    space: dict          # key -> (kind, values), keys sorted
    samples: int         # trials per round
    rounds: int
    sampler: str
    seed: int
    metric: str
    mode: str            # min | max

    @classmethod
    def from_sweep(cls, sweep: dict, item_schemas: dict) -> "Search | None":
        """The search of ``sweep`` (schema-complete), or None; a search it cannot plan raises
        one ValueError naming the key. ``item_schemas``: the grid's item schema per key."""
        search = sweep.get("search")
        if not search:
            return None
        lists = sorted(k for k in sweep if k not in ("search", "prune"))
        if lists:
            raise ValueError(
                f"sweep.search with the list(s) {', '.join('sweep.' + k for k in lists)}: a "
                "search samples every value of a trial, lists cross into a grid; put a list "
                "into the space as `choice: [...]` (sweep.search.space."
                f"{lists[0]}: {{choice: [...]}}) or remove it")
        space = search.get("space") or {}
        if not space:
            raise ValueError(f"sweep.search without sweep.search.space: nothing to sample, and "
                             f"rounds: {search.get('rounds', 1)} would have no results to tell; "
                             "give a space, e.g. {lr: {log_uniform: [0.001, 0.5]}}")
        checked = {}
        for key in sorted(space):
            if key not in SEARCHABLE:
                raise ValueError(f"sweep.search.space.{key}: not a key a search can vary; one of "
                                 f"{', '.join(SEARCHABLE)}")
            entry = space[key]
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ValueError(f"sweep.search.space.{key}: one distribution, e.g. "
                                 "{log_uniform: [low, high]}; one of " + ", ".join(KINDS))
            (kind, values), = entry.items()
            if kind not in KINDS:
                raise ValueError(f"sweep.search.space.{key}: unknown distribution {kind!r}; one "
                                 f"of {', '.join(KINDS)}")
            check_range(key, kind, values, item_schemas.get(key, {}))
            checked[key] = (kind, tuple(values))
        metric = search.get("metric", "test_acc")
        if metric not in METRICS:
            raise ValueError(f"sweep.search.metric {metric!r} unknown; one of {sorted(METRICS)}")
        sampler = search.get("sampler", "random")
        if sampler not in SAMPLERS:
            raise ValueError(f"sweep.search.sampler {sampler!r} unknown; one of {SAMPLERS}")
        for key in ("samples", "rounds"):
            if int(search.get(key, 1)) < 1:
                raise ValueError(f"sweep.search.{key} {search[key]} must be at least 1")
        return cls(checked, int(search.get("samples", 10)), int(search.get("rounds", 1)),
                   sampler, int(search.get("seed", 0)), metric,
                   search.get("mode") or METRICS[metric])

    # ---- names
    @property
    def digest(self) -> str:
        """What makes a study: the space, the sampler, its seed and what is optimised (not
        samples or rounds: raising them extends the same study)."""
        what = json.dumps([sorted((k, v[0], list(v[1])) for k, v in self.space.items()),
                           self.sampler, self.seed, self.metric, self.mode])
        return hashlib.sha256(what.encode()).hexdigest()[:8]

    def study_name(self, strategy: str) -> str:
        return f"{strategy}-{self.digest}"

    def trial_name(self, strategy: str, r: int, i: int) -> str:
        """Readable and stable: the strategy, the round, the trial's index in its round."""
        return f"{strategy}_r{r}_t{i:0{max(4, len(str(self.samples - 1)))}d}"

    # ---- sampling
    def predetermined(self, r: int) -> bool:
        """Whether round r's values are known from the config alone (random, qmc, TPE's
        first round), or asked of the study once round r-1 was told (TPE)."""
        return self.sampler != "tpe" or r == 1

    def distributions(self) -> dict:
        optuna = quiet_optuna()
        d = optuna.distributions
        out = {}
        for key, (kind, values) in self.space.items():
            if kind == "choice":
                out[key] = d.CategoricalDistribution(list(values))
            elif kind in ("int", "log_int"):
                out[key] = d.IntDistribution(int(values[0]), int(values[1]), log=kind == "log_int")
            else:
                out[key] = d.FloatDistribution(float(values[0]), float(values[1]),
                                               log=kind == "log_uniform")
        return out

    def planned(self, r: int, count: int | None = None) -> list[dict]:
        """The values of round r's first ``count`` trials (all: ``samples``), for a
        predetermined round; the same for any count's prefix."""
        optuna = quiet_optuna()
        count = self.samples if count is None else count
        dists = self.distributions()
        if self.sampler == "qmc":
            sampler = optuna.samplers.QMCSampler(
                qmc_type="sobol", scramble=True, seed=derive_seed(self.seed, r),
                warn_independent_sampling=False, warn_asynchronous_seeding=False)
            study = optuna.create_study(sampler=sampler)
            return [study.ask(dists).params for _ in range(count)]
        study = optuna.create_study()
        values = []
        for i in range(count):
            study.sampler = optuna.samplers.RandomSampler(seed=derive_seed(self.seed, r, i))
            values.append(study.ask(dists).params)
        return values

    def adaptive_sampler(self, r: int, i: int):
        """The sampler that asks trial i of a later TPE round of the study: round 1 is its
        start-up (n_startup_trials 1); the constant liar spreads a round's trials."""
        optuna = quiet_optuna()
        return optuna.samplers.TPESampler(seed=derive_seed(self.seed, r, i), n_startup_trials=1,
                                          constant_liar=True)

    # ---- what `snakemake -n` says
    def describe(self, trials: dict[str, dict]) -> list[str]:
        """One line per key: its distribution and the spread of the values sampled."""
        lines = []
        for key, (kind, values) in self.space.items():
            got = [t[key] for t in trials.values() if key in t]
            if kind == "choice":
                counts = {str(v): sum(1 for g in got if g == v) for v in values}
                spread = ", ".join(f"{v} {n}" for v, n in counts.items())
            elif got:
                got = sorted(got)
                spread = (f"sampled {fmt(got[0])} .. {fmt(got[-1])}, median "
                          f"{fmt(got[len(got) // 2])}")
            else:
                spread = "not sampled yet"
            lines.append(f"  {key}: {kind} {list(values)}: {spread}")
        return lines


def fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
