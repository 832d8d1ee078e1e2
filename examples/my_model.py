"""A model of your own for cifarflow: a small CNN whose width is set from the config.

    train:
      model: examples.my_model:small_cnn
      model_args: {width: 32}

The factory gets ``model_args`` as keyword arguments and returns an ``nn.Module`` that maps
a (N, 3, 32, 32) batch to (N, 10) logits. Inputs arrive channels_last by default, so
flatten with ``torch.flatten`` (``.view`` fails on them).
"""

import torch.nn as nn


def small_cnn(width: int = 32) -> nn.Module:
    def block(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                             nn.BatchNorm2d(c_out), nn.ReLU(inplace=True), nn.MaxPool2d(2))

    return nn.Sequential(block(3, width), block(width, 2 * width), block(2 * width, 4 * width),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10))
