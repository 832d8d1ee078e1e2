"""A fused group: K sweep members that share model, batch size and segment plan, trained in
one process as one model, one forward/backward/optimizer step for all of them.

Fusion stacks the members' parameters and buffers along a new leading dimension (torch.func
``stack_module_state``) and calls the model functionally on each member's slice:

* ``vmap`` (the default on CUDA): ``torch.func.vmap`` over ``functional_call``. Its batching
  rules turn the K convolutions into one grouped convolution, the K linear layers into one
  batched matmul and BatchNorm into one call over the concatenated channels: HFTA's fusion
  (Wang et al., MLSys 2021), without rewriting the model, so users' own models fuse too.
* ``loop`` (the default on CPU): the members' slices one after another in the same process.
  On CPU grouped convolutions are slower than K plain ones (docs/sweeps.md, measured), so
  what fusion keeps there is one process, one copy of the data and one optimizer step.

Each member is bookkept by its own engine ``Segment`` (progress, meter, log file, TensorBoard,
checkpoints): its segment directory holds an ordinary, unfused checkpoint, so a member can go
on alone, and a fused group resumes from its members' checkpoints. Each member keeps its own
seed (initial weights, batch order) and hyper-parameters: learning rate and its schedule
(its own torch scheduler, stepped per batch), momentum, weight decay, optimizer. The
optimizer step is one vectorised update over the stacked tensors with per-member
hyper-parameters (``FusedOptimizer``), the same arithmetic as torch's single-tensor SGD and
Adam. A member whose loss turns NaN or infinite leaves the group at the epoch's end; the
others never see its values (its gradients are its own slice).

The stacked model is fused_model.py's ``FusedModel``, the optimizer step fused_optim.py's
``FusedOptimizer``; here: the batches, the group's loop and its members' bookkeeping.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from .build import build_placed_model, seed_everything
from .fused_model import FusedModel, default_mode
from .fused_optim import FusedOptimizer
from .loaders import eval_batches, normalize
from .stop import StopController


class FusedBatches:
    """Each member's batch of one step, stacked: member k's batch b is the one it would see
    alone (its own seed's order), gathered in one index_select for all members."""

    def __init__(self, member_batches: list):
        self.members = member_batches
        first = member_batches[0]
        self.split, self.batch_size = first.split, first.batch_size
        self.channels_last = first.channels_last

    def __len__(self) -> int:
        return len(self.members[0])

    def epoch(self, epoch: int, start: int = 0):
        device = self.split.images.device
        orders = torch.stack([b.indices(epoch) for b in self.members]).to(device)
        size = self.batch_size
        for b in range(start, len(self)):
            sel = orders[:, b * size:(b + 1) * size]
            k, n = sel.shape
            flat = sel.reshape(-1)
            x = normalize(self.split.images.index_select(0, flat), self.channels_last)
            y = self.split.labels.index_select(0, flat)
            yield x.view(k, n, *x.shape[1:]), y.view(k, n)


class FusedGroup:
    """Drives the members' Segments (each resumed, at one position) through fused steps:
    stop and save decisions are the group's, taken once per batch for all."""

    def __init__(self, members: list, mode: str, say):
        self.members, self.say = members, say
        self.fused = FusedModel([m.model for m in members], mode)
        self.optimizer = FusedOptimizer(self.fused, [m.optimizer for m in members])
        self.optimizer.load()
        for m in members:  # their schedules follow the fused step, not optimizer.step()
            m.optimizer._opt_called = True
        self.strategy = members[0].strategy

    def autocast(self):
        return self.strategy.autocast()

    def train_step(self, x, y):
        """Mean loss (K,) and hits (K,) of each member's batch; one backward, one step."""
        k, n = y.shape
        with self.autocast():
            out = self.fused.forward(x)
            losses = F.cross_entropy(out.reshape(k * n, -1).float(), y.reshape(-1),
                                     reduction="none").view(k, n).mean(1)
        self.fused.zero_grad()
        losses.sum().backward()  # member k's gradient is that of its own loss only
        self.optimizer.step()
        for m in self.members:
            m.scheduler.step()
        hits = (out.detach().argmax(-1) == y).sum(1)
        return losses.detach(), hits

    @torch.no_grad()
    def evaluate(self) -> list[float]:
        """Test accuracy of every member on the shared test split."""
        first = self.members[0]
        s, cfg = first.strategy, first.cfg
        self.fused.train(False)
        hits = torch.zeros(self.fused.size, dtype=torch.float64, device=s.device)
        total = 0
        for x, y, valid in eval_batches(first.test_split, cfg.eval_batch_size, 0, 1,
                                        cfg.channels_last, s.device):
            with self.autocast():
                pred = self.fused.forward(x, shared_input=True).argmax(-1)
            hits += ((pred == y) & valid).sum(1).double()
            total += int(valid.sum())
        self.fused.train(True)
        return (hits / total).tolist()

    def export(self) -> None:
        self.fused.export_to([m.model for m in self.members])
        self.optimizer.export()

    def run(self, stop: StopController, batches: FusedBatches) -> tuple[str | None, list]:
        """Train to the members' target epoch or a stop, as ``Segment.run`` does for one
        run; returns the stop reason and the members that left the group early
        (diverged, early-stopped), already finished. The members still in it are ``self.members``."""
        members, left = self.members, []
        first, p = members[0], members[0].progress
        for m in members:
            m.begin(stop)
            m.start_epoch()
        reason = None
        may_save = all(m.work_dir is not None for m in members)
        while reason is None and p.epoch < first.until_epoch:
            for x, y in batches.epoch(p.epoch, p.step):
                losses, hits = self.train_step(x, y)
                for k, m in enumerate(members):
                    m.account(losses[k], hits[k], y.shape[1])
                if p.step >= first.steps:
                    break  # the epoch's end decides
                reason = self.decide(stop, may_save)
                if reason:
                    break
            if reason is not None:
                break
            self.close_epoch()
            ended = self.ended()
            if ended:
                left += ended
                batches = self._drop(ended)
                members = self.members
                if not members:
                    return None, left
                first, p = members[0], members[0].progress
            if p.epoch >= first.until_epoch:
                break
            for m in members:
                m.start_epoch()
            reason = self.decide(stop, may_save)
        self.export()
        return reason, left

    def decide(self, stop: StopController, may_save: bool) -> str | None:
        """The group's stop/save decision at a batch boundary (Segment._decide, once)."""
        members = self.members
        first = members[0]
        reason, save = stop.decide(first.meter.step_s() + first.save_s, may_save)
        if reason or save:
            for m in members:
                m.meter.fold(m.progress)
        if save:
            t0 = time.perf_counter()
            self.export()
            for m in members:
                m.save(m.work_dir)
                m.report.saved()
            save_s = time.perf_counter() - t0
            stop.saved()
            for m in members:
                m.save_s = save_s
                m.meter.restart_clock(m.progress)
        return reason

    def close_epoch(self) -> None:
        """Every member's epoch record: one fused evaluation; the GPU sampled once."""
        t_eval = time.perf_counter()
        accs = self.evaluate()
        eval_s = (time.perf_counter() - t_eval) / len(self.members)
        first = None
        for k, m in enumerate(self.members):
            rec = m.close_epoch(lambda k=k: accs[k])
            rec["eval_s"] = eval_s
            if first is None:
                first = rec
            elif rec["gpu_util_pct"] is None:
                rec["gpu_util_pct"], rec["gpu_mem_mb"] = first["gpu_util_pct"], first["gpu_mem_mb"]

    def ended(self) -> list:
        """Members whose run ends at this epoch's end: a loss that is no longer finite
        (diverged), or train.early_stop; the others go on."""
        for m in self.members:
            loss = m.progress.history[-1]["train_loss"]
            if not math.isfinite(loss):
                m.ended_early = f"diverged: train loss {loss} in epoch {m.progress.epoch}"
                m.log(f"WARNING: {m.ended_early}; the run ends here (the other members of "
                      "its fused group go on)")
        return [m for m in self.members if m.stopped_early()]

    def _drop(self, ended: list) -> FusedBatches | None:
        """The ended members publish their checkpoint (their run is done) and leave; the
        group goes on without them, re-stacked."""
        self.export()
        for m in ended:
            self.say(f"{m.cfg.run}: {m.stopped_early()}; it leaves the fused group")
            m.result = m.finish(None)
        self.members = [m for m in self.members if m not in ended]
        if not self.members:
            return None
        self.__init__(self.members, self.fused.mode, self.say)
        return FusedBatches([m.batches for m in self.members])


def build_members(members: list, mode: str | None = None) -> str:
    """Load the data once, build each member's model (its own seed), optimizer and
    schedule, exactly as the member would alone; returns the fusion mode."""
    first = members[0]
    first.load_data()
    batches0 = first.make_batches()
    for m in members:
        m.train_split, m.test_split = first.train_split, first.test_split
        m.data_dir = first.data_dir
        seed_everything(m.cfg.seed, m.cfg.deterministic, False)
        batches = batches0 if m is first else m.make_batches()
        model = build_placed_model(m.cfg, m.strategy)
        m.attach(model, *m.make_optimizer(model.parameters(), len(batches)), batches)
    return mode or default_mode(first.strategy.device)


def train_fused(members: list, mode: str | None, start_time: float, say) -> dict:
    """Segment k of each member (Segments built for one process each, not yet set up),
    fused: the members resumed at one position train as one group; members at another
    position (an earlier try stopped them elsewhere) form a group of their own, trained
    next, and say so. Returns each run's result, or its error (the others go on)."""
    members = sorted(members, key=lambda m: m.cfg.optimizer)  # one slice per kind
    for m in members:
        m.strategy.setup()
    mode = build_members(members, mode)
    results, groups = {}, {}
    for m in members:
        try:
            m.resume()
        except Exception as exc:  # this member's checkpoint: the others are not concerned
            results[m.cfg.run] = {"error": f"{type(exc).__name__}: {exc}"}
            m.log(f"ERROR: {type(exc).__name__}: {exc}")
            continue
        groups.setdefault((m.progress.epoch, m.progress.step), []).append(m)
    if len(groups) > 1:
        say(f"members resume at {len(groups)} different points: "
            + "; ".join(f"epoch {e + 1} batch {b}: {', '.join(m.cfg.run for m in ms)}"
                        for (e, b), ms in sorted(groups.items()))
            + " (one fused group each, one after another)")
    for position, group_members in sorted(groups.items()):
        first = group_members[0]
        say(f"fused group of {len(group_members)} ({mode}) on {first.strategy.device}, from "
            f"epoch {position[0] + 1} batch {position[1]}: "
            + ", ".join(m.cfg.run for m in group_members))
        stop = StopController(first.budget_s, first.cfg.margin_s, first.strategy, start_time,
                              first.cfg.checkpoint_interval_s)
        group = FusedGroup(group_members, mode, say)
        reason, left = group.run(stop, FusedBatches([m.batches for m in group.members]))
        for m in group.members:
            m.result = m.finish(reason)
        for m in [*left, *group.members]:
            results[m.cfg.run] = m.result
    return results
