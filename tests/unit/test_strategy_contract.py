"""The strategy contract: every class attribute a strategy sets is declared, with a comment,
in ``strategies/base.py``; a strategy says what it is through them (mps: replicas on one
GPU over gloo) rather than by overriding what its parent does."""

import functools
import re

import pytest

from conftest import ROOT
from cifarflow.engine.strategies import Strategy, registered
from cifarflow.engine.strategies.multiprocess import MultiProcessStrategy
from test_plan import runs_for

BASE = ROOT / "scripts" / "cifarflow" / "engine" / "strategies" / "base.py"


def contract() -> dict[str, str]:
    """Class attributes declared on Strategy -> their one-line comment."""
    return dict(re.findall(r"^    (\w+): ClassVar\[.+?\] = .+?  # (.+)$", BASE.read_text(), re.M))


def attributes(cls) -> set[str]:
    return {k for k, v in vars(cls).items() if not k.startswith("_") and not callable(v)
            and not isinstance(v, (classmethod, staticmethod, property,
                                                        functools.cached_property))}


def methods(cls) -> set[str]:
    return {k for k, v in vars(cls).items() if not k.startswith("_") and k not in attributes(cls)}


def test_every_attribute_a_strategy_sets_is_in_the_contract_with_a_comment():
    declared = contract()
    assert attributes(Strategy) == set(declared)  # each one with its comment
    assert {"gpu_per_rank", "processes_from", "fixed_settings"} <= set(declared)
    for cls in [MultiProcessStrategy, *registered().values()]:
        for klass in cls.__mro__[:cls.__mro__.index(Strategy)]:
            extra = attributes(klass) - set(declared)
            assert not extra, f"{klass.__name__} sets {extra}, not in Strategy's contract"


def test_mps_says_what_it_is_and_reuses_ddp():
    mps = registered()["mps"]
    assert methods(mps) == {"command_prefix"}  # the daemon wrapper: nothing of ddp undone
    assert (mps.processes_from, mps.gpu_per_rank) == ("mps.replicas", False)
    runs = runs_for(strategies=["ddp", "mps"], mps={"replicas": 3},
                    distributed={"device": "cuda", "world_size": 2, "lr_scaling": "linear"})
    cfg = runs["mps"].config
    assert (cfg.world_size, cfg.nodes, cfg.device, cfg.backend, cfg.lr_scaling) == \
        (3, 1, "cuda", "gloo", "linear")
    assert mps.gpus_per_node(cfg) == 1 and runs["mps"].resources["gres"] == "gpu:1"
    assert registered()["ddp"].gpus_per_node(runs["ddp"].config) == 2  # one per rank


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_one_process_strategies_need_no_world_setting(name):
    run = runs_for(strategies=[name])[name]
    assert run.config.world_size == 1 and run.strategy_class.gpus_per_node(run.config) == \
        (1 if name == "gpu" else 0)
