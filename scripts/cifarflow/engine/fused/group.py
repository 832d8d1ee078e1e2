"""A fused group: K sweep members that share model, batch size and segment plan, trained in
one process as one model, one forward/backward/optimizer step for all of them, at a cost
per step that does not grow with K in vmap fusion (docs/sweeps.md, "How it fuses").

The members' parameters live in one flat ``(K, P)`` tensor, their gradients in another
(model.py's ``FusedModel``), and the model is called on them in one of two ways:

* ``vmap`` (the default on CUDA): ``torch.func.vmap`` over ``functional_call``. Its batching
  rules turn the K convolutions into one grouped convolution (one dense convolution over a
  shared batch), the K linear layers into one batched matmul and BatchNorm into one call
  over the concatenated channels: HFTA's fusion (Wang et al., MLSys 2021), without
  rewriting the model, so users' own models fuse too (lenet has a hand-fused forward on
  the same grouped tensors, nets.py: vmap's pooling rule would copy them).
* ``loop`` (the default on CPU): each member's own module, its parameters views of its row
  of the flat tensors, one after another; on CPU grouped convolutions are slower than K
  plain ones (measured), and loop trains each member bit for bit as alone.

One copy of the data per group; one gathered batch for all when the members share a seed.
Each member is bookkept by its own engine ``Segment`` (progress, log file, TensorBoard,
checkpoints): its segment directory holds an ordinary, unfused checkpoint, so a member can
go on alone, and a fused group resumes from its members' checkpoints. Each member keeps its
own seed (initial weights, batch order, augmentation draws) and hyper-parameters (learning
rate and its schedule, momentum, weight decay, optimizer), applied by optim.py's
``FusedOptimizer`` in a few whole-buffer operations per step. A member whose loss turns NaN
or infinite leaves the group at the epoch's end; the others never see its values (its
gradients are its own row).

Here: the group's loop, its decisions and its members' bookkeeping; its batches are
batches.py's, its meter meter.py's; train.py builds and runs the groups of a
pack segment.
"""

from __future__ import annotations

import math
import time
import warnings

import torch
import torch.nn.functional as F

from ..evaluation import evaluate_fused
from .batches import FusedBatches
from .model import FusedModel
from .optim import FusedOptimizer
from ..meter import FusedMeter
from ..stop import StopController

# the members' parameters are views into one flat (K, P) tensor, their gradients views into
# another: autograd accumulates into them in place and says the strides are unusual
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout")


class FusedGroup:
    """Drives the members' Segments (each resumed, at one position) through fused steps:
    stop and save decisions are the group's, taken once per batch for all."""

    def __init__(self, members: list, mode: str, say, batches: FusedBatches | None = None):
        self.members, self.mode, self.say = members, mode, say
        first = members[0]
        self.batches = batches or FusedBatches([m.batches for m in members])
        self.batches.per_member = mode == "loop" and not first.cfg.compile  # compiled: tensors
        self.fused = FusedModel([m.model for m in members], mode)
        start = first.progress.epoch * first.steps + first.progress.step
        self.optimizer = FusedOptimizer(self.fused, [m.optimizer for m in members],
                                        [m.scheduler for m in members], [m.cfg for m in members],
                                        first.steps, start, first.until_epoch * first.steps)
        self.optimizer.load()
        self.strategy = first.strategy
        self.meter = FusedMeter(members)
        self.forward_loss, self.update = self._forward_loss, self.optimizer.update
        self.compiled = False
        if first.cfg.compile:
            self.compile()

    def autocast(self):
        return self.strategy.autocast()

    def compile(self) -> None:
        """train.compile: the forward pass with its loss (and so, through AOTAutograd, its
        backward) and the optimizer's update, each compiled once for the group (a last
        partial batch runs uncompiled: its shape would compile another forward)."""
        self.strategy.amp  # resolved now: dynamo breaks the graph at cached_property's lock
        self.forward_loss = torch.compile(self._forward_loss)
        self.update = torch.compile(self.optimizer.update)
        self.compiled = True

    def _forward_loss(self, x, y, shared: bool):
        """Logits (K, B, classes) and each member's mean loss (K,) on its batch."""
        with self.autocast():
            out = self.fused.forward(x, shared_input=shared)
        k, n = out.shape[:2]
        if shared:
            y = y.expand(k, n)
        smoothing = self.members[0].cfg.label_smoothing  # one for all (pack_plan.FUSE_KEYS)
        if self.mode == "loop":  # member by member already: each loss summed as alone
            return out, torch.stack([F.cross_entropy(out[i].float(), y[i],
                                                     label_smoothing=smoothing)
                                     for i in range(k)])
        losses = F.cross_entropy(out.reshape(k * n, -1).float(), y.reshape(-1), reduction="none",
                                 label_smoothing=smoothing).view(k, n).mean(1)
        return out, losses

    def train_step(self, x, y):
        """Mean loss (K,) and hits (K,) of each member's batch; one backward, one step."""
        shared = self.batches.shared
        full = y.shape[-1] == self.members[0].cfg.batch_size
        try:
            out, losses = (self.forward_loss if full else self._forward_loss)(x, y, shared)
        except Exception as exc:  # noqa: BLE001  a compiler's refusal: said once, then eager
            self.uncompile(exc)
            out, losses = self.forward_loss(x, y, shared)
        self.fused.zero_grad()
        losses.sum().backward()  # member k's gradient is that of its own loss only
        try:
            self.optimizer.step(self.update)
        except Exception as exc:  # noqa: BLE001  (a compiler fails before the update runs)
            self.uncompile(exc)
            self.optimizer.step(self.update)
        hits = (out.detach().argmax(-1) == y).sum(-1)
        return losses.detach(), hits

    def uncompile(self, exc: Exception) -> None:
        """A compiler's refusal: said once, the step eager from now on (else ``exc``)."""
        if not self.compiled:
            raise exc
        self.say(f"train.compile: the fused step runs uncompiled ({type(exc).__name__}: "
                 f"{str(exc).splitlines()[0][:200]})")
        self.forward_loss, self.update, self.compiled = \
            self._forward_loss, self.optimizer.update, False

    def evaluate(self) -> list[dict]:
        """Test accuracy of every member, in one fused evaluation (evaluation.py)."""
        first = self.members[0]
        return evaluate_fused(self.fused, first.test_split, first.cfg, first.strategy)

    def export(self) -> None:
        self.fused.export_to([m.model for m in self.members])
        self.optimizer.export()

    def run(self, stop: StopController) -> tuple[str | None, list]:
        """Train to the members' target epoch or a stop, as ``Segment.run`` does for one
        run; returns the stop reason and the members that left the group early
        (diverged, early-stopped), already finished. The members still in it are
        ``self.members``."""
        left = []
        for m in self.members:
            m.begin(stop)
        self.meter.start()
        reason = None
        may_save = all(m.work_dir is not None for m in self.members)
        first = self.members[0]
        while reason is None and first.progress.epoch < first.until_epoch:
            p = first.progress
            for x, y in self.batches.epoch(p.epoch, p.step):
                losses, hits = self.train_step(x, y)
                self.account(losses, hits, y.shape[-1])
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
                if not self._drop(ended):
                    return None, left
                first = self.members[0]
            if first.progress.epoch >= first.until_epoch:
                break
            self.meter.start()
            reason = self.decide(stop, may_save)
        self.export()
        return reason, left

    def account(self, losses, hits, n: int) -> None:
        """One fused step into the group's sums; each member's log line and TensorBoard
        point when the log is due (one copy of the K losses to the host)."""
        self.meter.add(losses, hits, n)
        first = self.members[0]
        due = self.meter.log_due()
        if not (due or (first.progress.step >= first.steps and first.report.board)):
            return
        self.meter.fold()
        for m, loss in zip(self.members, losses.tolist()):
            p = m.progress
            if due:
                m.log(f"  epoch {p.epoch + 1}/{m.cfg.epochs} batch {p.step}/{m.steps} "
                      f"loss {loss:.4f} {first.meter.images_per_sec(first.progress, 1):,.0f} "
                      f"img/s (fused group of {len(self.members)})")
            if m.report.board:
                m.report.batch_loss(loss, m.global_step())

    def decide(self, stop: StopController, may_save: bool) -> str | None:
        """The group's stop/save decision at a batch boundary (Segment._decide, once)."""
        first = self.members[0]
        reason, save = stop.decide(first.meter.step_s() + first.save_s, may_save)
        if reason or save:
            self.meter.fold()
        if save:
            t0 = time.perf_counter()
            self.export()
            for m in self.members:
                m.save(m.work_dir)
                m.report.saved()
            save_s = time.perf_counter() - t0
            stop.saved()
            for m in self.members:
                m.save_s = save_s
            self.meter.restart_clock()
        return reason

    def close_epoch(self) -> None:
        """Every member's epoch record: the sums and training time folded first (the
        evaluation is not training time), one fused evaluation, the GPU sampled once."""
        self.meter.fold()
        self.optimizer.sync_schedules()  # the records' lr
        t_eval = time.perf_counter()
        accs = self.evaluate()
        eval_s = (time.perf_counter() - t_eval) / len(self.members)
        first = None
        for k, m in enumerate(self.members):
            rec = m.close_epoch(lambda k=k: accs[k], folded=True)
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

    def _drop(self, ended: list) -> bool:
        """The ended members publish their checkpoint (their run is done) and leave; the
        group goes on without them, re-stacked. False when no member is left."""
        self.export()
        for m in ended:
            self.say(f"{m.cfg.run}: {m.stopped_early()}; it leaves the fused group")
            m.result = m.finish(None)
        members = [m for m in self.members if m not in ended]
        self.members = members
        if not members:
            return False
        self.__init__(members, self.mode, self.say,
                      FusedBatches([m.batches for m in members], self.batches.share))
        return True
