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
Each member is bookkept by its own ledger, an engine ``Segment`` (progress, log file,
TensorBoard, checkpoints): its segment directory holds an ordinary, unfused checkpoint, so a
member can go on alone, and a fused group resumes from its members' checkpoints. Each
member keeps its own seed (initial weights, batch order, augmentation draws) and
hyper-parameters (learning rate and its schedule, momentum, weight decay, optimizer), applied
by optim.py's ``FusedOptimizer`` in a few whole-buffer operations per step. A member whose
loss turns NaN or infinite leaves the group at the epoch's end; the others never see its
values (its gradients are its own row).

Here: the group's step (``FusedStep``), which engine/loop.py's one loop drives as it drives
one run's, its decisions and its members' books written there once; its batches are
batches.py's; train.py builds the groups of a pack segment.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ..evaluation import evaluate_fused
from .batches import FusedBatches
from .model import FusedModel
from .optim import FusedOptimizer

# the members' parameters are views into one flat (K, P) tensor, their gradients views into
# another: autograd accumulates into them in place and says the strides are unusual
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout")


class FusedStep:
    """One step of K members (ledgers, built and resumed at one position): their models as
    one ``FusedModel``, their optimizers and schedules as one ``FusedOptimizer``."""

    ends_diverged = True  # a member whose loss is no longer finite leaves the group

    def __init__(self, members: list, mode: str, say, share: bool = True):
        self.members, self.mode, self.say = members, mode, say
        self.note = f" (fused group of {len(members)})"
        first = members[0]
        self.batches = FusedBatches([m.batches for m in members], share)
        self.batches.per_member = mode == "loop" and not first.cfg.compile  # compiled: tensors
        self.fused = FusedModel([m.model for m in members], mode)
        start = first.progress.epoch * first.steps + first.progress.step
        self.optimizer = FusedOptimizer(self.fused, [m.optimizer for m in members],
                                        [m.scheduler for m in members], [m.cfg for m in members],
                                        first.steps, start, first.until_epoch * first.steps)
        self.optimizer.load()
        self.strategy = first.strategy
        self.forward_loss, self.update = self._forward_loss, self.optimizer.update
        self.compiled = False
        if first.cfg.compile:
            self.compile()

    def without(self, ended: list) -> FusedStep:
        """The step of the members that stay, re-stacked (``export`` first)."""
        return FusedStep([m for m in self.members if m not in ended], self.mode, self.say,
                         self.batches.share)

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
        """The members' own modules and optimizers take the trained state (saves, a member
        leaving, the end)."""
        self.fused.export_to([m.model for m in self.members])
        self.optimizer.export()

    def sync_schedules(self) -> None:
        self.optimizer.sync_schedules()
