"""The optimizer step of a fused group: one vectorised update over the stacked tensors, with
each member's own hyper-parameters (learning rate and its schedule, momentum, weight decay,
SGD or Adam): the same arithmetic as torch's single-tensor SGD and Adam. Part of
engine/fused.py's group."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .fused_model import FusedModel


def _view(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-member values (K,) broadcast against a stacked tensor (K, ...)."""
    return values.view((-1,) + (1,) * (like.dim() - 1))


class FusedOptimizer:
    """One update of all members' stacked parameters, with each member's own optimizer kind
    and hyper-parameters, read from its own torch optimizer (whose learning rate its own
    scheduler sets). Members are ordered so that each kind is one contiguous slice (a view).

    The arithmetic is torch's single-tensor SGD (momentum, dampening 0, no Nesterov) and
    Adam (no amsgrad); ``export``/``load`` move the state to and from the members' own
    optimizers, in torch's own format, for their checkpoints."""

    def __init__(self, fused: FusedModel, optimizers: list):
        self.fused, self.optimizers = fused, optimizers
        kinds = [self.kind(opt) for opt in optimizers]
        if kinds != sorted(kinds):
            raise ValueError("fused members must be ordered by optimizer kind")
        self.slices = [(kind, kinds.index(kind), len(kinds) - kinds[::-1].index(kind))
                       for kind in sorted(set(kinds))]
        self.device = next(iter(fused.params.values())).device
        for opt in optimizers:
            g = opt.param_groups[0]
            if g.get("nesterov") or g.get("dampening", 0) or g.get("amsgrad") or g.get("maximize"):
                raise ValueError("fused optimizers: SGD without nesterov/dampening, Adam "
                                 "without amsgrad")
        self.names = list(fused.params)
        self.state = {name: {} for name in self.names}
        self.steps = torch.zeros(len(optimizers), device=self.device)  # Adam's step count
        self.started = False  # SGD's momentum buffers hold a value

    @staticmethod
    def kind(optimizer) -> str:
        return "adam" if isinstance(optimizer, torch.optim.Adam) else "sgd"

    def _buffer(self, name: str, key: str) -> torch.Tensor:
        if key not in self.state[name]:
            self.state[name][key] = torch.zeros_like(self.fused.params[name].detach())
        return self.state[name][key]

    HYPER = ("lr", "momentum", "weight_decay", "beta1", "beta2", "eps")

    def hyper(self) -> tuple[list, dict]:
        """Each member's hyper-parameters now, as its schedule left them (OneCycleLR moves
        momentum and Adam's beta1 too): the host's rows, and one (K,) tensor per name on the
        device. On CUDA the copy is from pinned memory, non-blocking: the step never waits
        for the GPU to drain (a plain .to() would synchronise the stream every step)."""
        rows = []
        for opt in self.optimizers:
            g = opt.param_groups[0]
            beta1, beta2 = g.get("betas", (0.9, 0.999))
            rows.append([g["lr"], g.get("momentum", 0.0), g["weight_decay"], beta1, beta2,
                         g.get("eps", 1e-8)])
        values = torch.tensor(rows, dtype=torch.float32).t().contiguous()
        if self.device.type == "cuda":
            values = values.pin_memory().to(self.device, non_blocking=True)
        return rows, dict(zip(self.HYPER, values))

    @torch.no_grad()
    def step(self) -> None:
        rows, hyper = self.hyper()
        for kind, start, end in self.slices:
            part = {name: values[start:end] for name, values in hyper.items()}
            # whether any member of the slice decays or has momentum: known on the host
            decay = any(row[2] for row in rows[start:end])
            momentum = any(row[1] for row in rows[start:end])
            if kind == "sgd":
                self._sgd(slice(start, end), decay, momentum, **part)
            else:
                self._adam(slice(start, end), decay, **part)
        self.started = True

    def _sgd(self, part: slice, decay: bool, with_momentum: bool, lr, momentum, weight_decay,
             **_) -> None:
        wd = weight_decay
        for name in self.names:
            p = self.fused.params[name].detach()[part]
            d = self.fused.params[name].grad[part]
            if decay:
                d = d + _view(wd, p) * p
            if with_momentum:
                buf = self._buffer(name, "momentum_buffer")[part]
                if self.started:
                    buf.mul_(_view(momentum, buf)).add_(d)
                else:
                    buf.copy_(d)
                d = torch.where(_view(momentum, buf) != 0, buf, d)
            p.sub_(_view(lr, p) * d)

    def _adam(self, part: slice, decay: bool, lr, weight_decay, beta1, beta2, eps, **_) -> None:
        wd, b1, b2 = weight_decay, beta1, beta2
        self.steps[part] += 1
        step = self.steps[part]
        bias1, bias2_sqrt = 1 - b1 ** step, (1 - b2 ** step).sqrt()
        for name in self.names:
            p = self.fused.params[name].detach()[part]
            d = self.fused.params[name].grad[part]
            if decay:
                d = d + _view(wd, p) * p
            m = self._buffer(name, "exp_avg")[part]
            v = self._buffer(name, "exp_avg_sq")[part]
            m.lerp_(d, _view(1 - b1, m))
            v.mul_(_view(b2, v)).add_(_view(1 - b2, v) * d * d)
            denom = (v.sqrt() / _view(bias2_sqrt, v)).add_(_view(eps, v))
            p.sub_(_view(lr / bias1, p) * m / denom)

    # ---- the members' own optimizers (their checkpoints) ------------------------------
    def _member_params(self, k: int) -> list:
        return list(self.optimizers[k].param_groups[0]["params"])

    @torch.no_grad()
    def load(self) -> None:
        """Stacked state from the members' optimizers (after they resumed)."""
        have = [bool(opt.state) for opt in self.optimizers]
        momentum_members = [k for k, opt in enumerate(self.optimizers)
                            if self.kind(opt) == "sgd" and opt.param_groups[0]["momentum"]]
        self.started = any(have[k] for k in momentum_members)
        if self.started and not all(have[k] for k in momentum_members):
            raise ValueError("fused members resumed at different points (momentum state)")
        for k, opt in enumerate(self.optimizers):
            for name, param in zip(self.names, self._member_params(k)):
                state = opt.state.get(param, {})
                for key in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
                    if state.get(key) is not None:
                        self._buffer(name, key)[k].copy_(state[key])
                if "step" in state:
                    self.steps[k] = float(state["step"])

    @torch.no_grad()
    def export(self) -> None:
        """Each member's state into its own optimizer, as torch keeps it (copies)."""
        for k, opt in enumerate(self.optimizers):
            sgd = self.kind(opt) == "sgd"
            if sgd and (not opt.param_groups[0]["momentum"] or not self.started):
                continue  # torch keeps no momentum buffer before the first step, or without
            if not sgd and self.steps[k] == 0:
                continue
            for name, param in zip(self.names, self._member_params(k)):
                if sgd:
                    opt.state[param] = {"momentum_buffer": self.state[name]["momentum_buffer"][k].clone()}
                else:
                    opt.state[param] = {"step": self.steps[k].detach().cpu().clone(),
                                        "exp_avg": self.state[name]["exp_avg"][k].clone(),
                                        "exp_avg_sq": self.state[name]["exp_avg_sq"][k].clone()}
