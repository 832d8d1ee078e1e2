"""sweep.search: the plan of a search (stable, reproducible trials), its refusals, and the
study's tell/ask (told once, asked once, TPE's later rounds from the study). No training."""

import math

import jsonschema
import pytest

from cifarflow.config import with_defaults
from cifarflow.schema import schema
from cifarflow.controller.pack_plan import build_packs
from cifarflow.controller.plan import build_runs, sweep_item_schemas
from cifarflow.controller.search import Search
from cifarflow.controller.study_journal import Outcome, outcome_of, tell_and_ask
from cifarflow.results.study import best_trials, load_studies


def config(search: dict, **sweep) -> dict:
    return with_defaults({"strategies": ["cpu"], "data": {"source": "synthetic"},
                          "sweep": {"search": search, **sweep}})


SPACE = {"lr": {"log_uniform": [1e-4, 1.0]}, "momentum": {"uniform": [0.0, 0.99]},
         "batch_size": {"int": [32, 512]}, "optimizer": {"choice": ["sgd", "adam"]}}


def trials(cfg) -> dict:
    return {name: run.swept for name, run in build_runs(cfg).items()}


@pytest.mark.parametrize("sampler", ["random", "qmc", "tpe"])
def test_the_same_config_plans_the_same_trials(sampler):
    cfg = config({"space": SPACE, "samples": 12, "sampler": sampler, "seed": 3})
    first, second = trials(cfg), trials(config({"space": dict(reversed(SPACE.items())),
                                                "samples": 12, "sampler": sampler, "seed": 3}))
    assert first == second and len(first) == 12
    assert len({tuple(sorted(v.items())) for v in first.values()}) == 12  # all differ
    other = trials(config({"space": SPACE, "samples": 12, "sampler": sampler, "seed": 4}))
    assert list(other) == list(first) and other != first  # the seed draws other values


@pytest.mark.parametrize("sampler", ["random", "qmc", "tpe"])
def test_more_samples_keep_the_earlier_trials_and_names(sampler):
    few = trials(config({"space": SPACE, "samples": 5, "sampler": sampler}))
    more = trials(config({"space": SPACE, "samples": 40, "sampler": sampler}))
    assert {name: more[name] for name in few} == few
    assert list(more)[:5] == list(few) == [f"cpu_r1_t000{i}" for i in range(5)]


def test_values_lie_in_their_distributions_and_have_the_keys_type():
    for swept in trials(config({"space": SPACE, "samples": 50})).values():
        assert 1e-4 <= swept["lr"] <= 1.0 and 0 <= swept["momentum"] <= 0.99
        assert isinstance(swept["batch_size"], int) and 32 <= swept["batch_size"] <= 512
        assert swept["optimizer"] in ("sgd", "adam")
    lrs = sorted(s["lr"] for s in trials(config({"space": SPACE, "samples": 200})).values())
    # log-uniform: about half of the draws below the geometric middle (0.01)
    assert 70 < sum(1 for v in lrs if v < 0.01) < 130


def test_later_tpe_rounds_are_placeholders_until_asked():
    runs = build_runs(config({"space": SPACE, "samples": 4, "rounds": 3, "sampler": "tpe"}))
    assert [r.round for r in runs.values()] == [1] * 4 + [2] * 4 + [3] * 4
    assert [r.sampled for r in runs.values()] == [True] * 4 + [False] * 8
    random = build_runs(config({"space": SPACE, "samples": 4, "rounds": 2}))
    assert all(r.sampled for r in random.values())  # known from the config alone
    assert random["cpu_r1_t0000"].swept != random["cpu_r2_t0000"].swept


def test_trials_pack_per_round_and_a_trial_is_configured_by_its_values():
    runs = build_runs(config({"space": SPACE, "samples": 20, "rounds": 2}))
    packs = build_packs(runs, 16)
    assert sorted(packs) == ["cpu-r1-pack001", "cpu-r1-pack002", "cpu-r2-pack001",
                             "cpu-r2-pack002"]
    assert all(len({runs[m].round for m in p.members}) == 1 for p in packs.values())
    run = runs["cpu_r1_t0007"]
    assert (run.config.lr, run.config.momentum, run.config.batch_size, run.config.optimizer) == \
        (run.swept["lr"], run.swept["momentum"], run.swept["batch_size"], run.swept["optimizer"])


@pytest.mark.parametrize("search, sweep, message", [
    ({"space": {"lr": {"normal": [0, 1]}}}, {}, "sweep.search.space.lr: unknown distribution 'normal'"),
    ({"space": {"lr": {"uniform": [0.5, 0.1]}}}, {}, "sweep.search.space.lr: uniform [0.5, 0.1]: low must be below high"),
    ({"space": {"lr": {"uniform": [0.1, 0.1]}}}, {}, "low must be below high"),
    ({"space": {"lr": {"log_uniform": [0, 1]}}}, {}, "sweep.search.space.lr: log_uniform [0, 1]: a log range must lie above 0"),
    ({"space": {"optimizer": {"choice": []}}}, {}, "sweep.search.space.optimizer: choice is empty"),
    ({"space": {"epochs": {"int": [1, 5]}}}, {}, "sweep.search.space.epochs: not a key a search can vary"),
    ({"space": {"optimizer": {"choice": ["sgd", "rmsprop"]}}}, {}, "sweep.search.space.optimizer: 'rmsprop' is not a value of optimizer"),
    ({"space": {"lr": {"uniform": [-1, 1]}}}, {}, "sweep.search.space.lr: -1 is not a value of lr"),
    ({"space": {"batch_size": {"uniform": [32, 64]}}}, {}, "batch_size takes integers"),
    ({"space": {}, "rounds": 3}, {}, "rounds: 3 would have no results to tell"),
    ({"space": SPACE}, {"seed": [0, 1]}, "sweep.search with the list(s) sweep.seed"),
])
def test_bad_input_is_one_error_naming_the_key(search, sweep, message):
    with pytest.raises(ValueError) as exc:
        build_runs(config(search, **sweep))
    assert message in str(exc.value)


def test_the_schema_refuses_what_it_can_express():
    validator = jsonschema.Draft202012Validator(schema())
    for bad in ({"space": {"lr": {"normal": [0, 1]}}}, {"space": {"epochs": {"int": [1, 2]}}},
                {"space": {"lr": {"uniform": [0.1, 0.2], "int": [1, 2]}}},
                {"space": SPACE, "sampler": "grid"}, {"space": SPACE, "samples": 0}):
        errors = list(validator.iter_errors(config(bad)))
        assert errors, bad
    assert not list(validator.iter_errors(config({"space": SPACE, "sampler": "tpe"})))


def test_outcome_of_a_run():
    history = [{"epoch": 1, "test_acc": 0.2}, {"epoch": 2, "test_acc": 0.3}]
    assert outcome_of(history, "test_acc", None) == Outcome("COMPLETE", 0.3, {1: 0.2, 2: 0.3})
    pruned = outcome_of(history[:1], "test_acc", 1)
    assert (pruned.state, pruned.value, pruned.intermediate) == ("PRUNED", 0.2, {1: 0.2})
    nan = outcome_of([{"epoch": 1, "test_acc": float("nan")}], "test_acc", None)
    assert nan.state == "FAIL" and "nan" in nan.reason
    diverged = outcome_of(history, "test_acc", None, "diverged: train_loss nan at epoch 2")
    assert diverged.state == "FAIL" and diverged.reason.startswith("diverged")


def objective(params) -> float:
    """A made-up accuracy, best at lr 0.01 (in log space)."""
    return 1.0 - abs(math.log10(params["lr"]) + 2) / 4


def tell_round(search, tmp_path, r, records, **outcome_kw):
    previous = records.get(r - 1, {"trials": {}})["trials"]
    outcomes = {name: Outcome("COMPLETE", objective(t["params"]), {1: objective(t["params"])})
                for name, t in previous.items()}
    outcomes.update(outcome_kw)
    records[r] = tell_and_ask(search, "cpu", r, outcomes, str(tmp_path / "study.journal"),
                              str(tmp_path / f"round-{r}.json"), log=lambda line: None)
    return records[r]


def search_of(**kw) -> Search:
    search = {"space": {"lr": {"log_uniform": [1e-5, 1.0]}}, "samples": 16, "rounds": 3,
              "sampler": "tpe", "seed": 0, **kw}
    return Search.from_sweep(config(search)["sweep"], sweep_item_schemas())


def test_rounds_are_told_once_and_asked_once(tmp_path):
    search, records = search_of(samples=6), {}
    first = tell_round(search, tmp_path, 1, records)
    again = tell_round(search, tmp_path, 1, records)  # a rerun of an interrupted ask job
    assert first["trials"] == again["trials"]
    assert [t["params"] for t in first["trials"].values()] == search.planned(1)
    tell_round(search, tmp_path, 2, records)
    second = tell_round(search, tmp_path, 2, records)  # told again: nothing changes
    assert set(second["told"].values()) == {"COMPLETE"}
    tell_round(search, tmp_path, 3, records)
    tell_round(search, tmp_path, 4, records)  # tells round 3, asks nothing
    study, = load_studies(tmp_path / "study.journal")
    runs = [t.user_attrs["run"] for t in study.trials]
    assert len(runs) == len(set(runs)) == 18  # every trial once
    assert {t.state.name for t in study.trials} == {"COMPLETE"}
    assert [t.intermediate_values for t in study.trials] == [{1: t.value} for t in study.trials]
    best = best_trials(study, 1)[0]
    assert best.value == max(t.value for t in study.trials)


class Crash(Exception):
    """The ask job killed (node trouble, Ctrl-C) at a chosen point."""


def test_a_crash_between_the_tell_and_the_rounds_record_tells_nothing_twice(tmp_path,
                                                                           monkeypatch):
    """Round 2's ask job crashes twice: after telling 3 of round 1's 6 trials, then after
    telling the rest and asking round 2 but before writing the round's record. Each rerun
    tells only what was not told, asks only what was not asked, and the study ends with
    every trial once and its one value."""
    search, records = search_of(samples=6), {}
    tell_round(search, tmp_path, 1, records)
    outcomes = {name: Outcome("COMPLETE", objective(t["params"]), {1: objective(t["params"])})
                for name, t in records[1]["trials"].items()}
    journal, record = str(tmp_path / "study.journal"), str(tmp_path / "round-2.json")
    said = []

    def crash_after_three_tells(line):
        said.append(line)
        if sum(s.startswith("told") for s in said) == 3:
            raise Crash

    with pytest.raises(Crash):
        tell_and_ask(search, "cpu", 2, outcomes, journal, record, log=crash_after_three_tells)
    first_told = [s.split()[3].strip("():") for s in said if s.startswith("told")]
    assert len(first_told) == 3 and not (tmp_path / "round-2.json").exists()

    import cifarflow.engine.checkpoints.files as ckpt

    def no_record(path, text):
        raise Crash

    said.clear()
    monkeypatch.setattr(ckpt, "atomic_write_text", no_record)
    with pytest.raises(Crash):
        tell_and_ask(search, "cpu", 2, outcomes, journal, record, log=said.append)
    monkeypatch.undo()
    second_told = [s.split()[3].strip("():") for s in said if s.startswith("told")]
    asked = {s.split()[3].strip("():"): int(s.split()[2]) for s in said if s.startswith("asked")}
    assert sorted(first_told + second_told) == sorted(outcomes)  # each told once so far
    assert len(asked) == 6 and not (tmp_path / "round-2.json").exists()

    said.clear()
    done = tell_and_ask(search, "cpu", 2, outcomes, journal, record, log=said.append)
    assert said == []  # nothing told, nothing asked again
    assert done["told"] == {name: "COMPLETE" for name in outcomes}
    assert {name: t["number"] for name, t in done["trials"].items()} == asked
    study, = load_studies(tmp_path / "study.journal")
    assert len(study.trials) == 12 and len({t.user_attrs["run"] for t in study.trials}) == 12
    for t in study.trials:
        if t.user_attrs["run"] in outcomes:
            assert t.state.name == "COMPLETE" and t.value == outcomes[t.user_attrs["run"]].value
            assert t.intermediate_values == {1: t.value}


def test_a_pruned_trial_is_pruned_in_the_study_with_its_last_value(tmp_path):
    search, records = search_of(samples=2, rounds=1), {}
    tell_round(search, tmp_path, 1, records)
    a, b = records[1]["trials"]
    tell_round(search, tmp_path, 2, records,
               **{a: Outcome("PRUNED", 0.25, {1: 0.25}, "pruned after segment 1"),
                  b: Outcome("FAIL", None, {1: 0.1}, "diverged: loss nan")})
    study, = load_studies(tmp_path / "study.journal")
    states = {t.user_attrs["run"]: t for t in study.trials}
    assert (states[a].state.name, states[a].value, states[a].intermediate_values) == \
        ("PRUNED", 0.25, {1: 0.25})
    assert states[b].state.name == "FAIL" and states[b].user_attrs["reason"] == "diverged: loss nan"


def test_tpe_rounds_after_the_first_concentrate_around_the_best(tmp_path):
    """Round 1 random; round 2 asked of the study after round 1 was told: its lr values lie
    closer (in log space) to round 1's best than round 1's own uniform draws did."""
    search, records = search_of(samples=16, rounds=2, seed=5), {}
    tell_round(search, tmp_path, 1, records)
    tell_round(search, tmp_path, 2, records)
    first = [t["params"]["lr"] for t in records[1]["trials"].values()]
    second = [t["params"]["lr"] for t in records[2]["trials"].values()]
    best = max(first, key=lambda lr: objective({"lr": lr}))

    def spread(values):
        return sorted(abs(math.log10(v) - math.log10(best)) for v in values)[len(values) // 2]

    assert spread(second) < 0.6 * spread(first), (spread(first), spread(second))
    assert second != search.planned(2)  # not the random draws a random search would make


def test_config_strings_are_typed_inside_the_space():
    """`--config 'sweep={"search": ...}'` hands numbers over as strings."""
    from cifarflow.schema import typed_like_schema

    typed = typed_like_schema({"sweep": {"search": {
        "space": {"lr": {"log_uniform": ["0.001", "1"]}, "batch_size": {"int": ["32", "64"]},
                  "optimizer": {"choice": ["sgd", "adam"]}}, "samples": "5"}}}, schema())
    assert typed["sweep"]["search"] == {
        "space": {"lr": {"log_uniform": [0.001, 1]}, "batch_size": {"int": [32, 64]},
                  "optimizer": {"choice": ["sgd", "adam"]}}, "samples": 5}
