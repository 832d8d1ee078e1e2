"""Hand-fused forwards of registered models, for vmap fusion: the K members' layers written
on the physical ``(B, K*C, H, W)`` tensor a grouped convolution makes (one dense
convolution over a shared batch), so the pooling runs on it as it is. Under ``vmap`` the
max-pool's batching rule re-lays out every convolution's output and the next grouped
convolution's input (5 activation-sized copies a lenet step, issue 48). The same
arithmetic as vmap's rules (grouped convolutions, batched matmuls), in the same order;
a model without an entry here is vmapped. Part of model.py's ``FusedModel``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models import Net


def grouped_input(x: torch.Tensor, shared: bool) -> torch.Tensor:
    """The batch as the first convolution reads it: a shared (B, C, H, W) batch as it is;
    the members' own batches (K, B, C, H, W) as one (B, K*C, H, W) tensor in the members'
    memory format (one copy, as vmap's rule makes)."""
    if shared:
        return x
    k, b, c, h, w = x.shape
    if x[0].is_contiguous(memory_format=torch.channels_last) and not x[0].is_contiguous():
        return x.permute(1, 3, 4, 0, 2).reshape(b, h, w, k * c).permute(0, 3, 1, 2)
    return x.transpose(0, 1).reshape(b, k * c, h, w)


def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, groups: int,
         **kw) -> torch.Tensor:
    """K convolutions as one: ``weight`` (K, O, I, h, w) whose (K, O) fold into one
    dimension without a copy (model.py's ChannelsLastStack layout, or contiguous)."""
    return F.conv2d(x, weight.flatten(0, 1), None if bias is None else bias.flatten(),
                    groups=groups, **kw)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """K linear layers as one batched matmul: x (K, B, in), weight (K, out, in)."""
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


def lenet(net: Net, params: dict, buffers: dict, x: torch.Tensor, shared: bool) -> torch.Tensor:
    """``models.Net.forward`` of K members: logits (K, B, 10)."""
    k = params["conv1.weight"].shape[0]
    h = conv(grouped_input(x, shared), params["conv1.weight"], params["conv1.bias"],
             1 if shared else k)
    h = F.max_pool2d(F.relu(h), 2, 2)
    h = F.max_pool2d(F.relu(conv(h, params["conv2.weight"], params["conv2.bias"], k)), 2, 2)
    b, _, hh, ww = h.shape
    # each member's (16, 5, 5) features in torch.flatten's order, members first: one copy
    h = h.view(b, k, -1, hh, ww).transpose(0, 1).reshape(k, b, -1)
    h = F.relu(linear(h, params["fc1.weight"], params["fc1.bias"]))
    h = F.relu(linear(h, params["fc2.weight"], params["fc2.bias"]))
    return F.relu(linear(h, params["fc3.weight"], params["fc3.bias"]))


FUSED = {Net: lenet}


def fused_forward(template: torch.nn.Module):
    """The hand-fused forward of the template's model, or None (vmap it)."""
    return FUSED.get(type(template))
