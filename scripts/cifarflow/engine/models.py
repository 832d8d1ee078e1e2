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

from ..model_cards import CARDS, ModelCard, user_card

MODELS: dict[str, Callable[[], nn.Module]] = {}


def register(name: str):
    """A model of the registry: its card (model_cards.CARDS) says what the controller knows
    of it; a factory without one is a mistake of this package, said at import."""
    if name not in CARDS:
        raise ValueError(f"model {name!r} has no card: add one to cifarflow/model_cards.py")

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


def check_model(name: str, args: dict | None = None, channels_last: bool = False) -> ModelCard:
    """Build the model on CPU and run a forward pass on a (2, 3, 32, 32) batch of zeros,
    which must give (2, 10) logits; then, for a run with train.channels_last, on the same
    batch in that memory format, as training feeds it. Any failure is one ValueError line.
    Its card, with the sizes of the model built."""
    return _check_model(name, json.dumps(args or {}, sort_keys=True), channels_last)


@functools.cache  # the planner asks once per run; a sweep repeats the same model
def _check_model(name: str, args_json: str, channels_last: bool) -> ModelCard:
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
    return user_card(name, model)


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


class _ConvGroup(nn.Module):
    """airbench94's block: conv 3x3, max-pool 2, BatchNorm, GELU, conv 3x3, BatchNorm, GELU."""

    def __init__(self, c_in: int, c_out: int, momentum: float):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = nn.BatchNorm2d(c_out, momentum=momentum, eps=1e-12)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(c_out, momentum=momentum, eps=1e-12)
        self.act = nn.GELU()

    def forward(self, x):
        x = self.act(self.norm1(self.pool(self.conv1(x))))
        return self.act(self.norm2(self.conv2(x)))


@register("fastnet")
class FastNet(nn.Module):
    """The network of airbench94 (K. Jordan, "94% on CIFAR-10 in 3.29 seconds on a single
    GPU", arXiv 2404.00498; github.com/KellerJordan/cifar10-airbench), written here rather
    than imported (docs/recipes.md says why): a 2x2 stem of 24 channels, three conv groups
    of 64, 256 and 256 channels (each halves the resolution: 31 -> 15 -> 7 -> 3), a 3x3
    max-pool, a linear head scaled by 1/9. 1.97 M parameters.

    What it leaves out of airbench's trainer: the stem's whitening initialisation from
    training patches (the stem trains like every other layer), frozen BatchNorm weights,
    Nesterov SGD with a 64x bias learning rate, lookahead; the engine's SGD, schedules and
    ``train.label_smoothing``, ``train.augment``, ``eval.tta`` stand in for them."""

    def __init__(self, widths: tuple = (64, 256, 256), momentum: float = 0.4):
        super().__init__()
        self.stem = nn.Conv2d(3, 24, kernel_size=2, padding=0, bias=True)
        self.act = nn.GELU()
        self.group1 = _ConvGroup(24, widths[0], momentum)
        self.group2 = _ConvGroup(widths[0], widths[1], momentum)
        self.group3 = _ConvGroup(widths[1], widths[2], momentum)
        self.pool = nn.MaxPool2d(3)
        self.head = nn.Linear(widths[2], 10, bias=False)
        self.scale = 1 / 9

    def forward(self, x):
        x = self.act(self.stem(x))
        x = self.group3(self.group2(self.group1(x)))
        return self.head(torch.flatten(self.pool(x), 1)) * self.scale

    def shard_units(self) -> list[nn.Module]:
        return [self.group1, self.group2, self.group3]


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one (the root is sharded last): the model's own
    ``shard_units()``, else a ResNet's layer1..4, else none (the model is one unit)."""
    if hasattr(model, "shard_units"):
        return model.shard_units()
    return [m for name in ("layer1", "layer2", "layer3", "layer4")
            for m in getattr(model, name, [])]
