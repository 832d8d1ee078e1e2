"""Training strategies, one module each; importing a module registers its class."""

import importlib

from .base import STRATEGIES, Strategy, StrategyError, get_strategy

MODULES = ("cpu", "gpu", "ddp", "fsdp", "mps", "lightning")


def load_all() -> dict:
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return STRATEGIES


__all__ = ["STRATEGIES", "Strategy", "StrategyError", "get_strategy", "load_all"]
