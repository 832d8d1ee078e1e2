"""The optimizer step of a fused group: a few whole-buffer operations over the members' flat
``(K, P)`` parameters, gradients and states, with each member's own hyper-parameters as
``(K, 1)`` device tensors: the same arithmetic as torch's single-tensor SGD (momentum,
weight decay) and Adam (L2 weight decay), whatever K and however many parameter tensors.

The schedules are not stepped per member and per batch on the host: ``HyperTable`` builds,
once per group, each member's learning rate (and OneCycle's momentum / beta1) for every step
of the segment ahead on the device, and the step reads its row (a view, no copy). The
members' own torch optimizers and schedulers are synced at exports (saves, the segment's
end), so their checkpoints stay in the unfused format. Part of the fused step (step.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..build import build_optimizer, build_scheduler
from .model import member_view

if TYPE_CHECKING:
    from .model import FusedModel

HYPER = ("lr", "momentum", "weight_decay", "beta1", "beta2", "eps")
LR, MOMENTUM, WEIGHT_DECAY, BETA1, BETA2, EPS = range(len(HYPER))


def kind(optimizer) -> str:
    return "adam" if isinstance(optimizer, torch.optim.Adam) else "sgd"


def hyper_of(group: dict) -> list[float]:
    """One param group's hyper-parameters, in HYPER's order."""
    beta1, beta2 = group.get("betas", (0.9, 0.999))
    return [group["lr"], group.get("momentum", 0.0), group["weight_decay"], beta1, beta2,
            group.get("eps", 1e-8)]


class HyperTable:
    """Every member's hyper-parameters at every global step from ``start`` to ``end``:
    (steps, 6, K) tensors on the device, float32 for the step and float64 for Adam's bias
    corrections, row t - start for step t (and a float64 copy on the host for syncs).

    Members whose schedules have the same shape (scheduler, epochs, warmup, optimizer kind)
    share one reference schedule, stepped once on the host: a member's learning rate is its
    own base rate times the reference's factor (every schedule here scales with its base
    rate), and what the schedule cycles besides (OneCycle's momentum and beta1) follows the
    reference. The table is a function of the configs and the step only, so a group resumed
    at step t reads the same rows as one that went through t."""

    def __init__(self, cfgs: list, steps_per_epoch: int, start: int, end: int, device):
        self.start, self.end = start, end
        rows = torch.empty(end - start + 1, len(HYPER), len(cfgs), dtype=torch.float64)
        references: dict[tuple, tuple] = {}
        for k, cfg in enumerate(cfgs):
            shape = (cfg.scheduler, cfg.epochs, cfg.warmup_epochs, cfg.optimizer)
            if shape not in references:
                references[shape] = self.reference(cfg, steps_per_epoch, start, end)
            ref, ref_base = references[shape]
            base = torch.tensor(hyper_of(build_optimizer(cfg, [torch.zeros(1)]).param_groups[0]),
                                dtype=torch.float64)
            member = base.expand(len(ref), -1).clone()
            member[:, LR] = base[LR] * (ref[:, LR] / ref_base)  # a constant: exactly base
            for column in (MOMENTUM, BETA1):
                if not torch.all(ref[:, column] == ref[0, column]):  # the schedule cycles it
                    member[:, column] = ref[:, column]
            rows[:, :, k] = member
        self.host = rows  # float64: what the members' optimizers and records are given
        self.rows64 = rows.to(device)  # Adam's bias corrections, in double as torch's
        self.rows = self.rows64.to(torch.float32)

    @staticmethod
    def reference(cfg, steps_per_epoch: int, start: int, end: int) -> tuple:
        """The schedule of ``cfg`` (float64 rows of steps start..end) and its base rate."""
        optimizer = build_optimizer(cfg, [torch.zeros(1, requires_grad=True)])
        base = optimizer.param_groups[0]["lr"]
        optimizer._opt_called = True  # stepped without optimizer.step(): no warning
        scheduler = build_scheduler(cfg, optimizer, steps_per_epoch)
        for _ in range(start):
            scheduler.step()
        out = []
        for t in range(start, end + 1):
            out.append(hyper_of(optimizer.param_groups[0]))
            if t < end:
                scheduler.step()
        return torch.tensor(out, dtype=torch.float64), base

    def at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(6, K) hyper-parameters of global step ``step``, float32 and float64: views."""
        return self.rows[step - self.start], self.rows64[step - self.start]


class FusedOptimizer:
    """One update of all members' flat parameters, each member with its own optimizer kind
    and hyper-parameters. Members are ordered so that each kind is a contiguous block of
    rows; each kind's update is a handful of whole-block operations.

    ``export``/``load`` move the state to and from the members' own torch optimizers and
    schedulers, in torch's own format, for their checkpoints."""

    def __init__(self, fused: FusedModel, optimizers: list, schedulers: list, cfgs: list,
                 steps_per_epoch: int, start_step: int, end_step: int):
        self.fused, self.optimizers, self.schedulers = fused, optimizers, schedulers
        kinds = [kind(opt) for opt in optimizers]
        if kinds != sorted(kinds):
            raise ValueError("fused members must be ordered by optimizer kind")
        self.blocks = [(name, kinds.index(name), len(kinds) - kinds[::-1].index(name))
                       for name in sorted(set(kinds))]
        for opt in optimizers:
            g = opt.param_groups[0]
            if g.get("nesterov") or g.get("dampening", 0) or g.get("amsgrad") or g.get("maximize"):
                raise ValueError("fused optimizers: SGD without nesterov/dampening, Adam "
                                 "without amsgrad")
        flat = fused.flat
        self.device = flat.device
        self.table = HyperTable(cfgs, steps_per_epoch, start_step, end_step, self.device)
        self.step_index = start_step
        # what is known on the host decides which operations run at all
        self.decays = {b: any(c.weight_decay for c in cfgs[s:e]) for b, s, e in self.blocks}
        # SGD members with a momentum buffer: a momentum, or OneCycle's cycled one
        self.uses_momentum = [kind(opt) == "sgd" and (bool(opt.param_groups[0]["momentum"])
                                                      or cfg.scheduler == "onecycle")
                              for opt, cfg in zip(optimizers, cfgs)]
        self.state: dict[str, torch.Tensor] = {}
        self.steps = torch.zeros(len(optimizers), 1, dtype=torch.float64,
                                 device=self.device)  # Adam's step count
        self.started = False  # SGD's momentum buffers hold a value (their export)
        # every state buffer the update touches, made (zeros) before the first step: a
        # compiled update then sees the same tensors at every step and compiles once; a
        # zero momentum buffer's first step, 0 * momentum + d, is torch's first buffer d
        if any(self.uses_momentum):
            self.buffer("momentum_buffer")
        if "adam" in kinds:
            self.buffer("exp_avg"), self.buffer("exp_avg_sq")

    def buffer(self, key: str) -> torch.Tensor:
        if key not in self.state:
            self.state[key] = torch.zeros_like(self.fused.flat)
        return self.state[key]

    @torch.no_grad()
    def step(self, update=None) -> None:
        """One step of every member: ``update`` is ``self.update``, or its compiled form."""
        (update or self.update)(*self.table.at(self.step_index))
        self.started = True
        self.step_index += 1

    def update(self, hyper: torch.Tensor, hyper64: torch.Tensor) -> None:
        """The arithmetic of one step, hyper-parameters (6, K) given: each optimizer kind's
        block of rows in a few whole-block operations."""
        for name, start, end in self.blocks:
            rows = slice(start, end)
            h = hyper[:, rows].unsqueeze(-1)  # (6, k, 1): broadcast over the columns
            p, g = self.fused.flat[rows], self.fused.flat_grad[rows]
            if self.decays[name]:
                g = torch.addcmul(g, h[WEIGHT_DECAY], p)
            if name == "sgd":
                self._sgd(rows, p, g, h)
            else:
                self._adam(rows, p, g, h, hyper64[:, rows].unsqueeze(-1))

    def _sgd(self, rows: slice, p, d, h) -> None:
        with_momentum = self.uses_momentum[rows]
        if any(with_momentum):
            buf = self.state["momentum_buffer"][rows]
            buf.mul_(h[MOMENTUM]).add_(d)  # zeros before the first step: d, as torch's
            d = buf if all(with_momentum) else torch.where(h[MOMENTUM] != 0, buf, d)
        p.addcmul_(d, h[LR], value=-1)

    def _adam(self, rows: slice, p, d, h, h64) -> None:
        """torch's single-tensor Adam, operation for operation: its scalars (the bias
        corrections, the step size) are computed in double and rounded once, as torch does
        on the host, so a member trains bit for bit as alone."""
        b1, b2 = h64[BETA1], h64[BETA2]
        step = self.steps[rows]
        step += 1
        bias1, bias2_sqrt = 1 - b1 ** step, (1 - b2 ** step) ** 0.5
        m, v = self.state["exp_avg"][rows], self.state["exp_avg_sq"][rows]
        m.lerp_(d, (1 - b1).float())
        v.mul_(h[BETA2]).addcmul_((1 - b2).float() * d, d)
        denom = (v.sqrt() / bias2_sqrt.float()).add_(h[EPS])
        p.add_((-(h64[LR] / bias1)).float() * m / denom)

    # ---- the members' own optimizers and schedulers (their checkpoints) -----------------
    def _member_params(self, k: int) -> list:
        return list(self.optimizers[k].param_groups[0]["params"])

    def _views(self, flat: torch.Tensor, k: int):
        """(parameter of member k's optimizer, its slice of ``flat``) pairs."""
        for (name, like), param in zip(self.fused.params.items(), self._member_params(k)):
            yield param, member_view(flat, self.fused.offsets[name], like[0])[k]

    @torch.no_grad()
    def load(self) -> None:
        """Flat state from the members' optimizers (after they resumed)."""
        momentum_members = [k for k, used in enumerate(self.uses_momentum) if used]
        have = [bool(self.optimizers[k].state) for k in momentum_members]
        self.started = any(have)
        if self.started and not all(have):
            raise ValueError("fused members resumed at different points (momentum state)")
        for k, opt in enumerate(self.optimizers):
            states = [opt.state.get(param, {}) for param in self._member_params(k)]
            for key in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
                if any(state.get(key) is not None for state in states):
                    for (_, view), state in zip(self._views(self.buffer(key), k), states):
                        view.copy_(state[key])
            if "step" in states[0]:
                self.steps[k] = float(states[0]["step"])

    def sync_schedules(self) -> None:
        """Each member's hyper-parameters now and its schedule's position into its own
        optimizer and scheduler (what its records and checkpoint read)."""
        hyper = self.table.host[self.step_index - self.table.start].t().tolist()
        for k, (opt, scheduler) in enumerate(zip(self.optimizers, self.schedulers)):
            group = opt.param_groups[0]
            lr, momentum, _, beta1, _, _ = hyper[k]
            group["lr"] = lr
            if "momentum" in group:
                group["momentum"] = momentum
            if "betas" in group:
                group["betas"] = (beta1, group["betas"][1])
            scheduler.last_epoch, scheduler._step_count = self.step_index, self.step_index + 1
            scheduler._last_lr = [lr]

    @torch.no_grad()
    def export(self) -> None:
        """Each member's state into its own optimizer (copies, as torch keeps it), and its
        hyper-parameters and schedule position into its optimizer and scheduler."""
        self.sync_schedules()
        steps = self.steps.flatten().tolist()
        for k, opt in enumerate(self.optimizers):
            if kind(opt) == "sgd":
                if self.uses_momentum[k] and self.started:  # else torch keeps no buffer
                    for param, view in self._views(self.buffer("momentum_buffer"), k):
                        opt.state[param] = {"momentum_buffer": view.clone()}
            elif steps[k]:
                step = torch.tensor(steps[k])
                for (param, m), (_, v) in zip(self._views(self.buffer("exp_avg"), k),
                                              self._views(self.buffer("exp_avg_sq"), k)):
                    opt.state[param] = {"step": step.clone(), "exp_avg": m.clone(),
                                        "exp_avg_sq": v.clone()}
