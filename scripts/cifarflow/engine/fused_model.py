"""The K members of a fused group as one model: their parameters and buffers stacked along a
new leading dimension (torch.func ``stack_module_state``), called functionally on each
member's slice, with ``vmap`` (one grouped convolution, one batched matmul) or one after
another (``loop``). Part of engine/fused.py's group."""

from __future__ import annotations

import copy

import torch
from torch.func import functional_call, stack_module_state, vmap

MODES = ("vmap", "loop")


def default_mode(device) -> str:
    """vmap where grouped convolutions pay (CUDA), loop on CPU (measured: bench/gpu_sweep.py)."""
    return "vmap" if str(device).startswith("cuda") else "loop"


def member_layout(stacked: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A copy of the stacked tensor (K, ...) whose slices keep the member's memory format:
    channels_last convolution weights stay channels_last (oneDNN and cuDNN would otherwise
    reorder them at every call)."""
    if like.dim() == 4 and like.is_contiguous(memory_format=torch.channels_last) \
            and not like.is_contiguous():
        k, o, i, h, w = stacked.shape
        out = torch.empty((k, o, h, w, i), dtype=stacked.dtype, device=stacked.device)
        out = out.permute(0, 1, 4, 2, 3)
        return out.copy_(stacked)
    return stacked.clone()


class FusedModel:
    """The stacked parameters and buffers of K members of one architecture. The members'
    own modules are where their state is imported from and exported to (checkpoints)."""

    def __init__(self, modules: list, mode: str):
        if mode not in MODES:
            raise ValueError(f"fused mode {mode!r}: one of {MODES}")
        self.mode, self.size = mode, len(modules)
        self.template = copy.deepcopy(modules[0]).to("meta")
        params, buffers = stack_module_state(modules)
        self.params = {name: member_layout(p.detach(), modules[0].get_parameter(name))
                       .requires_grad_() for name, p in params.items()}
        self.buffers = {name: b.detach().clone() for name, b in buffers.items()}
        for p in self.params.values():
            p.grad = torch.zeros_like(p)  # accumulated into in place: one tensor for the step

    def member_state(self, k: int) -> dict:
        """Member k's parameters and buffers: views into the stacked tensors."""
        state = {name: p[k] for name, p in self.params.items()}
        state.update({name: b[k] for name, b in self.buffers.items()})
        return state

    @torch.no_grad()
    def export_to(self, modules: list) -> None:
        """Each member's current weights and running statistics into its own module."""
        for k, module in enumerate(modules):
            for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
                stacked = self.params.get(name)
                tensor.copy_(stacked[k] if stacked is not None else self.buffers[name][k])

    def train(self, mode: bool = True) -> None:
        self.template.train(mode)

    def forward(self, x, shared_input: bool = False):
        """Logits (K, B, classes) of each member on its own batch x[k] (x: (K, B, ...)), or
        on the same batch x (B, ...) with ``shared_input``."""
        if self.mode == "vmap":
            def call(params, buffers, inputs):
                return functional_call(self.template, (params, buffers), (inputs,))
            fused = vmap(call, in_dims=(0, 0, None if shared_input else 0), randomness="different")
            return fused(self.params, self.buffers, x)
        return torch.stack([functional_call(self.template, self.member_state(k),
                                            (x if shared_input else x[k],))
                            for k in range(self.size)])

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad.zero_()
