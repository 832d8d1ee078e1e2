"""The K members of a fused group as one model. Their parameters live in ONE flat ``(K, P)``
tensor (member k's row holds its P parameter values) and their gradients in another; each
parameter is a ``(K, ...)`` view into it, so the optimizer updates every member's every
parameter in a few whole-buffer operations and one ``zero_`` clears all gradients. The model
is called with ``vmap``, functionally on the views (one grouped convolution, one batched
matmul; with a shared input batch, conv1 is one dense convolution over K x its channels;
lenet's own hand-fused forward, nets.py, computes the same without vmap), or in ``loop``,
member after member, each member's own module with its parameters made views of its row.
Part of the fused step (step.py)."""

from __future__ import annotations

import copy
import types

import torch
from torch.func import functional_call, stack_module_state, vmap

from .nets import fused_forward

MODES = ("vmap", "loop")


def default_mode(device) -> str:
    """vmap where grouped convolutions pay (CUDA), loop on CPU (measured: bench/fused_cpu.py)."""
    return "vmap" if str(device).startswith("cuda") else "loop"


def keeps_channels_last(like: torch.Tensor) -> bool:
    return like.dim() == 4 and like.is_contiguous(memory_format=torch.channels_last) \
        and not like.is_contiguous()


def member_view(flat: torch.Tensor, start: int, like: torch.Tensor) -> torch.Tensor:
    """Columns start.. of the flat (K, P) tensor as a (K, *like.shape) view whose member
    slices keep the member's memory format: channels_last convolution weights stay
    channels_last (oneDNN and cuDNN would otherwise reorder them at every call)."""
    block = flat[:, start:start + like.numel()]
    if keeps_channels_last(like):
        o, i, h, w = like.shape
        return block.view(-1, o, h, w, i).permute(0, 1, 4, 2, 3)
    return block.view(-1, *like.shape)


def vmap_template(template: torch.nn.Module) -> torch.nn.Module:
    """The template vmap calls (a copy of a member's module, on the meta device), made for
    vmap: its in-place activations (``inplace=True`` modules: ReLU, ...; torchvision
    BasicBlock's ``out += identity``) out-of-place, since on the views vmap hands them an
    in-place op makes autograd copy the activation back and forth; its convolutions cast
    to autocast's dtype by hand, since vmap's convolution rule runs them outside autocast
    (a bf16 run's convolutions would run in float32), and so its BatchNorms in float32
    (vmap's rule refuses a bf16 input with float32 statistics); a global average pool as a
    mean (vmap ran the pool member by member). The members' own modules are
    untouched: loop fusion and a run alone compute as before."""
    for module in template.modules():
        if getattr(module, "inplace", False) is True:
            module.inplace = False
        if type(module).__name__ == "BasicBlock" and type(module).__module__ == TORCHVISION_RESNET:
            module.forward = types.MethodType(_basic_block, module)
        if type(module) is torch.nn.Conv2d:
            module.forward = types.MethodType(_autocast_conv, module)
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.forward = types.MethodType(_float_batch_norm, module)
        if type(module) is torch.nn.AdaptiveAvgPool2d and module.output_size in (1, (1, 1)):
            module.forward = types.MethodType(_global_average, module)
    return template


TORCHVISION_RESNET = "torchvision.models.resnet"


def _autocast_conv(self, x):
    """``Conv2d.forward`` with its operands in autocast's dtype where autocast is on."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return self._conv_forward(x, self.weight, self.bias)
    dtype = torch.get_autocast_dtype(device)
    return self._conv_forward(x.to(dtype), self.weight.to(dtype),
                              None if self.bias is None else self.bias.to(dtype))


def _float_batch_norm(self, x):
    """BatchNorm's forward on a float32 input where autocast is on."""
    return type(self).forward(self, x.float() if torch.is_autocast_enabled(x.device.type) else x)


def _global_average(self, x):
    """``AdaptiveAvgPool2d(1)`` as a mean over height and width: vmap has no batching rule
    for the pool's ``as_strided_`` and ran it member by member (resnet18's head)."""
    return x.mean((-2, -1), keepdim=True)


def _basic_block(self, x):
    """torchvision's ``BasicBlock.forward`` with ``out + identity`` for its ``out += identity``."""
    identity = x if self.downsample is None else self.downsample(x)
    out = self.relu(self.bn1(self.conv1(x)))
    return self.relu(self.bn2(self.conv2(out)) + identity)


class ChannelsLastStack(torch.autograd.Function):
    """A (K, O, I, h, w) convolution weight, a view of the flat tensor whose members are
    channels_last, copied where vmap can fold (K, O) into one dimension with each member
    still channels_last; its gradient passes back as it comes (autograd adds it into the
    flat gradient's view: a ``copy_`` of a view would add a new_zeros, a copy and a clone
    per weight to every backward)."""

    @staticmethod
    def forward(ctx, weight):
        k, o, i, h, w = weight.shape
        return weight.new_empty((k, o, h, w, i)).permute(0, 1, 4, 2, 3).copy_(weight)

    @staticmethod
    def backward(ctx, grad):
        return grad


class FusedModel:
    """The parameters and buffers of K members of one architecture. The members' own
    modules are where their state is imported from and exported to (checkpoints)."""

    def __init__(self, modules: list, mode: str):
        if mode not in MODES:
            raise ValueError(f"fused mode {mode!r}: one of {MODES}")
        self.mode, self.size = mode, len(modules)
        self.template = vmap_template(copy.deepcopy(modules[0]).to("meta"))
        first = modules[0]
        names = [name for name, _ in first.named_parameters()]
        self.offsets, total = {}, 0
        for name in names:
            self.offsets[name] = total
            total += first.get_parameter(name).numel()
        device, dtype = first.get_parameter(names[0]).device, first.get_parameter(names[0]).dtype
        self.flat = torch.empty(self.size, total, dtype=dtype, device=device)
        self.flat_grad = torch.zeros_like(self.flat)
        self.params = {}
        for name in names:
            like = first.get_parameter(name)
            view = member_view(self.flat, self.offsets[name], like)
            with torch.no_grad():
                view.copy_(torch.stack([m.get_parameter(name).detach() for m in modules]))
            # a leaf whose storage is the flat tensor; autograd accumulates its gradient in
            # place into the flat gradient's view (p.grad is never replaced)
            view.requires_grad_()
            view.grad = member_view(self.flat_grad, self.offsets[name], like)
            self.params[name] = view
        # convolution weights kept channels_last: vmap folds (K, O) into one dimension, which
        # the flat tensor's row stride does not allow, so the call gets a copy whose member
        # slices stay channels_last (else oneDNN and cuDNN run another algorithm than alone)
        self.channels_last = [name for name in names
                              if keeps_channels_last(first.get_parameter(name))]
        if mode == "loop":
            self.modules = modules
            self._point_into_flat(modules)
            self.buffers = {}
        else:
            _, buffers = stack_module_state(modules)
            self.buffers = {name: b.detach().clone() for name, b in buffers.items()}
        # built now, not at the first call: a compiled step would see the dict change and
        # compile again
        self._vmapped = {shared: self._vmap(shared) for shared in (False, True)} \
            if mode == "vmap" else {}
        # a registered model's own fused forward (nets.py), else vmap's
        self.hand_fused = fused_forward(self.template) if mode == "vmap" else None

    def _point_into_flat(self, modules: list) -> None:
        """loop: each member's own module trains, its parameters made views of its row of the
        flat tensors (its gradients accumulate into the flat gradient): a plain call per
        member, no functional_call, and nothing to export but the buffers it keeps itself."""
        for k, module in enumerate(modules):
            for name, fused in self.params.items():
                owner, _, leaf = name.rpartition(".")
                owner = module.get_submodule(owner)
                param = torch.nn.Parameter(fused.detach()[k])
                param.grad = fused.grad[k]
                owner._parameters[leaf] = param

    @torch.no_grad()
    def export_to(self, modules: list) -> None:
        """Each member's current weights and running statistics into its own module (in
        loop fusion they are its module's already)."""
        if self.mode == "loop":
            return
        for k, module in enumerate(modules):
            for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
                fused = self.params.get(name)
                tensor.copy_(fused[k] if fused is not None else self.buffers[name][k])

    def train(self, mode: bool = True) -> None:
        for module in self.modules if self.mode == "loop" else [self.template]:
            module.train(mode)

    def _vmap(self, shared_input: bool):
        """The vmapped functional call for one input kind."""
        def call(params, buffers, inputs):
            return functional_call(self.template, (params, buffers), (inputs,))
        return vmap(call, in_dims=(0, 0, None if shared_input else 0), randomness="different")

    def forward(self, x, shared_input: bool = False):
        """Logits (K, B, classes) of each member on its own batch x[k] (x: (K, B, ...)), or
        on the same batch x (B, ...) with ``shared_input``."""
        if self.mode == "vmap":
            params = dict(self.params)
            for name in self.channels_last:
                params[name] = ChannelsLastStack.apply(params[name])
            if self.hand_fused is not None:
                return self.hand_fused(self.template, params, self.buffers, x, shared_input)
            return self._vmapped[shared_input](params, self.buffers, x)
        return torch.stack([module(x if shared_input else x[k])
                            for k, module in enumerate(self.modules)])

    def zero_grad(self) -> None:
        self.flat_grad.zero_()
