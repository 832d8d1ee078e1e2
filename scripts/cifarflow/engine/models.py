"""Models: the registry (add one with ``@register("name")``) and your own, named
``"package.module:factory"``. ``build_model(name, args)`` builds either kind;
``check_model(name, args)`` is the planner's test of a model, so a broken one fails in
``snakemake -n`` rather than on a compute node."""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS: dict[str, Callable[[], nn.Module]] = {}


def register(name: str):
    def deco(factory):
        MODELS[name] = factory
        return factory
    return deco


def build_model(name: str, args: dict | None = None) -> nn.Module:
    """A registered model, or a user's ``"package.module:factory"`` called with ``args``."""
    return model_factory(name)(**(args or {}))


def model_factory(name: str) -> Callable[..., nn.Module]:
    if ":" not in name:
        try:
            return MODELS[name]
        except KeyError:
            raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}, "
                             "or your own as package.module:factory") from None
    module_name, _, attr = name.partition(":")
    cwd = os.getcwd()  # the workflow's directory, where a job starts
    if cwd not in sys.path:
        sys.path.append(cwd)  # after installed packages: a local directory shadows none
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"train.model {name!r}: cannot import {module_name} "
                         f"({one_line(exc)}); put it under {cwd} (the workflow's directory) "
                         "or install it") from None
    path = getattr(module, "__file__", None)  # None for a namespace package
    where = f"{module_name} ({path})" if path else module_name
    if not hasattr(module, attr):
        raise ValueError(f"train.model {name!r}: {where} has no attribute {attr!r}")
    factory = getattr(module, attr)
    if not callable(factory):
        raise ValueError(f"train.model {name!r}: {module_name}.{attr} is not callable "
                         f"({type(factory).__name__}); name the function or class that "
                         "returns the model")
    return factory


def check_model(name: str, args: dict | None = None, channels_last: bool = False) -> None:
    """Build the model on CPU and run a forward pass on a (2, 3, 32, 32) batch of zeros,
    which must give (2, 10) logits; then, for a run with train.channels_last, on the same
    batch in that memory format, as training feeds it. Any failure is one ValueError line."""
    _check_model(name, json.dumps(args or {}, sort_keys=True), channels_last)


@functools.cache  # the planner asks once per run; a sweep repeats the same model
def _check_model(name: str, args_json: str, channels_last: bool) -> None:
    args = json.loads(args_json)
    call = f"{name}(**{args})" if args else f"{name}()"
    factory = model_factory(name)
    try:
        model = factory(**args)
    except Exception as exc:
        raise ValueError(f"train.model {call} failed: {one_line(exc)}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"train.model {call} returned {type(model).__name__}, "
                         "not a torch.nn.Module")
    try:
        with torch.no_grad():
            out = model.eval()(torch.zeros(2, 3, 32, 32))
    except Exception as exc:
        raise ValueError(f"train.model {call}: forward pass on a (2, 3, 32, 32) batch failed: "
                         f"{one_line(exc)}") from None
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != (2, 10):
        raise ValueError(f"train.model {call} maps a (2, 3, 32, 32) batch to {shape}; CIFAR-10 "
                         "needs (2, 10), one logit per class")
    if channels_last:
        try:
            with torch.no_grad():
                model(torch.zeros(2, 3, 32, 32).contiguous(memory_format=torch.channels_last))
        except Exception as exc:
            raise ValueError(f"train.model {call}: forward pass fails on a channels_last batch "
                             f"(train.channels_last: true, the default): {one_line(exc)}; "
                             "flatten with torch.flatten or .reshape rather than .view, or set "
                             "train.channels_last: false") from None


def one_line(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__


@register("lenet")
class Net(nn.Module):
    """The seed's ``Net``, layer for layer (including its ReLU on the logits)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        # in-place ReLUs compute the same values with fewer memory passes
        x = self.pool(F.relu(self.conv1(x), inplace=True))
        x = self.pool(F.relu(self.conv2(x), inplace=True))
        x = torch.flatten(x, 1)  # the seed's x.view(-1, 400), also valid for channels_last
        x = F.relu(self.fc1(x), inplace=True)
        x = F.relu(self.fc2(x), inplace=True)
        return F.relu(self.fc3(x))

    def shard_units(self) -> list[nn.Module]:
        return [self.conv1, self.conv2, self.fc1, self.fc2, self.fc3]


@register("resnet18")
def resnet18() -> nn.Module:
    """torchvision ResNet-18 for 32x32 inputs: 3x3 stem, stride 1, no max-pool."""
    from torchvision.models import resnet18 as tv_resnet18

    model = tv_resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one (the root is sharded last): the model's own
    ``shard_units()``, else a ResNet's layer1..4, else none (the model is one unit)."""
    if hasattr(model, "shard_units"):
        return model.shard_units()
    return [m for name in ("layer1", "layer2", "layer3", "layer4")
            for m in getattr(model, name, [])]
