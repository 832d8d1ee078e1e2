"""A user's model with BatchNorm (train.model: fused_models:small_bn_net), small enough for
CPU tests: what resnet18 and users' own models bring to a fused group, running statistics."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallBNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 4)
        return self.fc(torch.flatten(x, 1))


def small_bn_net() -> nn.Module:
    return SmallBNNet()
