"""Model registry: ``build_model(name)``; add a model with ``@register("name")``."""

from __future__ import annotations

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


def build_model(name: str) -> nn.Module:
    try:
        return MODELS[name]()
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


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
    """The blocks FSDP shards one by one (the root is sharded last)."""
    if hasattr(model, "shard_units"):
        return model.shard_units()
    return [m for name in ("layer1", "layer2", "layer3", "layer4")
            for m in getattr(model, name, [])]
