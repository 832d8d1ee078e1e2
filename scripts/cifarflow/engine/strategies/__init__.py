"""Training strategies, one module each. Every module in this package is discovered and
imported; its ``Strategy`` subclass registers itself by its ``name``. A new strategy is a
new file here, nothing else."""

import functools
import importlib
import pkgutil

from .base import STRATEGIES, Strategy, StrategyError


@functools.cache
def registered() -> dict[str, type[Strategy]]:
    """Imported once per process: planning asks for a strategy per run and per job."""
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            importlib.import_module(f"{__name__}.{module.name}")
    return STRATEGIES


def get_strategy(name: str) -> type[Strategy]:
    try:
        return registered()[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: "
                         f"{', '.join(sorted(STRATEGIES))}") from None


__all__ = ["STRATEGIES", "Strategy", "StrategyError", "get_strategy", "registered"]
