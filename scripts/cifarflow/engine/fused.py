"""A fused group: K sweep members that share model, batch size and segment plan, trained in
one process as one model, one forward/backward/optimizer step for all of them, at a cost
per step that does not grow with K in vmap fusion (docs/sweeps.md, "How it fuses").

The members' parameters live in one flat ``(K, P)`` tensor, their gradients in another
(fused_model.py's ``FusedModel``), and the model is called on them in one of two ways:

* ``vmap`` (the default on CUDA): ``torch.func.vmap`` over ``functional_call``. Its batching
  rules turn the K convolutions into one grouped convolution (one dense convolution over a
  shared batch), the K linear layers into one batched matmul and BatchNorm into one call
  over the concatenated channels: HFTA's fusion (Wang et al., MLSys 2021), without
  rewriting the model, so users' own models fuse too.
* ``loop`` (the default on CPU): each member's own module, its parameters views of its row
  of the flat tensors, one after another; on CPU grouped convolutions are slower than K
  plain ones (measured), and loop trains each member bit for bit as alone.

One copy of the data per group; one gathered batch for all when the members share a seed.
Each member is bookkept by its own engine ``Segment`` (progress, log file, TensorBoard,
checkpoints): its segment directory holds an ordinary, unfused checkpoint, so a member can
go on alone, and a fused group resumes from its members' checkpoints. Each member keeps its
own seed (initial weights, batch order, augmentation draws) and hyper-parameters (learning
rate and its schedule, momentum, weight decay, optimizer), applied by fused_optim.py's
``FusedOptimizer`` in a few whole-buffer operations per step. A member whose loss turns NaN
or infinite leaves the group at the epoch's end; the others never see its values (its
gradients are its own row).

Here: the batches, the group's loop and meter, and its members' bookkeeping.
"""

from __future__ import annotations

import math
import time
import warnings

import torch
import torch.nn.functional as F

from .augment import Draws, apply, mirror
from .build import build_placed_model, seed_everything
from .fused_model import FusedModel, default_mode
from .fused_optim import FusedOptimizer
from .loaders import eval_batches, normalize
from .stop import StopController

# the members' parameters are views into one flat (K, P) tensor, their gradients views into
# another: autograd accumulates into them in place and says the strides are unusual
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout")


class FusedBatches:
    """Each member's batch of one step: member k's batch b is the one it would see alone
    (its own seed's order), from ONE copy of the split on the device, whatever K.

    When every member has the same order (same seed: a sweep of lr, momentum, weight decay),
    the batch is gathered and normalised once and shared (``shared``: x is (B, ...), y (B,));
    otherwise the K batches are gathered in one index_select (x: (K, B, ...), y: (K, B)),
    or, for loop fusion (``per_member``), each just before its member's call (x: a list
    of K batches: one batch at a time stays in the CPU's caches; measured 0.95x -> 1.0x)."""

    def __init__(self, member_batches: list, share: bool = True):
        self.members, self.share = member_batches, share
        first = member_batches[0]
        self.split, self.batch_size = first.split, first.batch_size
        self.channels_last = first.channels_last
        self.shared = share and len({(b.seed, b.rank, b.world_size, b.shuffle, b.augment)
                                     for b in member_batches}) == 1
        self.augment = first.augment  # one for all members (plan.FUSE_KEYS)
        self.per_member = False

    def __len__(self) -> int:
        return len(self.members[0])

    def epoch(self, epoch: int, start: int = 0):
        device = self.split.images.device
        members = self.members[:1] if self.shared else self.members
        orders = torch.stack([b.indices(epoch) for b in members]).to(device)
        size = self.batch_size
        for b in range(start, len(self)):
            sel = orders[:, b * size:(b + 1) * size]
            k, n = sel.shape
            flat = sel.reshape(-1)
            if self.per_member and not self.shared:
                yield LazyBatches(self, members, sel, epoch, b), \
                    self.split.labels.index_select(0, flat).view(k, n)
                continue
            x = self.split.images.index_select(0, flat)
            if self.augment:  # each member's own draws (its seed), applied in one go
                x = apply(x, Draws.cat([self.augment.draws(n, m.seed, epoch, b, m.rank)
                                        for m in members]).to(device))
            x = normalize(x, self.channels_last)
            y = self.split.labels.index_select(0, flat)
            if self.shared:
                yield x, y
            else:
                yield x.view(k, n, *x.shape[1:]), y.view(k, n)


class LazyBatches:
    """Member k's batch of one step (its images gathered, augmented, normalised), made when
    the loop's call for member k asks for it."""

    def __init__(self, batches: FusedBatches, members: list, sel, epoch: int, b: int):
        self.batches, self.members, self.sel, self.epoch, self.b = batches, members, sel, epoch, b

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, k: int):
        source = self.batches
        x = source.split.images.index_select(0, self.sel[k])
        x = self.members[k].augmented(x, self.epoch, self.b)
        return normalize(x, source.channels_last)


class FusedMeter:
    """The group's epoch sums, one (K,) tensor each for loss and hits (two kernels a step,
    whatever K). The first member's meter keeps the clock and the counts; every member's
    progress is brought up to date at ``fold`` (saves, the epoch's end)."""

    def __init__(self, members: list):
        self.members = members
        self.first = members[0]
        self.loss = self.hits = None

    def start(self) -> None:
        device = self.first.meter.device
        for m in self.members:
            m.start_epoch()
        self.loss = torch.tensor([m.progress.loss_sum for m in self.members], dtype=torch.float64,
                                 device=device)
        self.hits = torch.tensor([m.progress.correct for m in self.members], dtype=torch.int64,
                                 device=device)

    def add(self, losses, hits, n: int) -> None:
        self.loss.add_(losses, alpha=n)  # exact in float64, as EpochMeter.add
        self.hits += hits
        p, meter = self.first.progress, self.first.meter
        p.seen += n
        p.step += 1
        meter.steps0 += 1

    def fold(self) -> None:
        """Every member's progress: its sums, the shared position, its training time."""
        p0, meter0 = self.first.progress, self.first.meter
        elapsed = meter0.elapsed()
        for m, loss, hits in zip(self.members, self.loss.tolist(), self.hits.tolist()):
            m.progress.loss_sum, m.progress.correct = loss, hits
            m.progress.step, m.progress.seen = p0.step, p0.seen
            m.meter.steps0 = meter0.steps0
            m.progress.train_s = m.meter.base_s + elapsed

    def restart_clock(self) -> None:
        for m in self.members:
            m.meter.restart_clock(m.progress)

    def log_due(self) -> bool:
        return self.first.meter.due_for_log(self.first.cfg.log_interval_s)


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
        backward) and the optimizer's update, each compiled once for the group."""
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
        smoothing = self.members[0].cfg.label_smoothing  # one for all (plan.FUSE_KEYS)
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
        try:
            out, losses = self.forward_loss(x, y, shared)
        except Exception as exc:  # noqa: BLE001  a compiler's refusal: said once, then eager
            if not self.compiled:
                raise
            self.say(f"train.compile: the fused step runs uncompiled ({type(exc).__name__}: "
                     f"{str(exc).splitlines()[0][:200]})")
            self.forward_loss, self.update, self.compiled = \
                self._forward_loss, self.optimizer.update, False
            out, losses = self.forward_loss(x, y, shared)
        self.fused.zero_grad()
        losses.sum().backward()  # member k's gradient is that of its own loss only
        self.optimizer.step(self.update)
        hits = (out.detach().argmax(-1) == y).sum(-1)
        return losses.detach(), hits

    @torch.no_grad()
    def evaluate(self) -> list[dict]:
        """Test accuracy of every member on the shared test split (``test_acc``), and with
        eval.tta flip ``test_acc_tta`` (the mean of the logits of an image and its mirror),
        as Segment.evaluate."""
        first = self.members[0]
        s, cfg = first.strategy, first.cfg
        tta = cfg.tta == "flip"
        self.fused.train(False)
        hits = torch.zeros(2, self.fused.size, dtype=torch.float64, device=s.device)
        total = 0
        for x, y, valid in eval_batches(first.test_split, cfg.eval_batch_size, 0, 1,
                                        cfg.channels_last, s.device):
            with self.autocast():
                logits = self.fused.forward(x, shared_input=True)
                both = logits.float() + self.fused.forward(mirror(x), shared_input=True).float() \
                    if tta else logits
            hits[0] += ((logits.argmax(-1) == y) & valid).sum(1).double()
            hits[1] += ((both.argmax(-1) == y) & valid).sum(1).double()
            total += int(valid.sum())
        self.fused.train(True)
        accs, accs_tta = (hits / total).tolist()
        return [{"test_acc": a, **({"test_acc_tta": t} if tta else {})}
                for a, t in zip(accs, accs_tta)]

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


def build_members(members: list, mode: str | None = None) -> str:
    """Load the data once and put it on the device ONCE (every member's batches read the
    same tensors, whatever K); build each member's model (its own seed), optimizer and
    schedule, exactly as the member would alone; returns the fusion mode."""
    first = members[0]
    first.load_data()
    first.train_split = first.train_split.to(first.strategy.device)
    batches0 = first.make_batches()  # also moves the test split to the device
    for m in members:
        m.train_split, m.test_split = first.train_split, first.test_split
        m.data_dir = first.data_dir
        seed_everything(m.cfg.seed, m.cfg.deterministic, False)
        batches = batches0 if m is first else m.make_batches()
        model = build_placed_model(m.cfg, m.strategy)
        m.attach(model, *m.make_optimizer(model.parameters(), len(batches)), batches)
    return mode or default_mode(first.strategy.device)


def train_fused(members: list, mode: str | None, start_time: float, say,
                share_input: bool = True) -> dict:
    """Segment k of each member (Segments built for one process each, not yet set up),
    fused: the members resumed at one position train as one group; members at another
    position (an earlier try stopped them elsewhere) form a group of their own, trained
    next, and say so. Returns each run's result, or its error (the others go on)."""
    members = sorted(members, key=lambda m: m.cfg.optimizer)  # a block per kind
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
        group = FusedGroup(group_members, mode, say,
                           FusedBatches([m.batches for m in group_members], share_input))
        if len(group_members) > 1:
            say("one batch shared by all members (same order)" if group.batches.shared
                else "each member its own batch order (seeds differ)")
        reason, left = group.run(stop)
        for m in group.members:
            m.result = m.finish(reason)
        for m in [*left, *group.members]:
            results[m.cfg.run] = m.result
    return results


def fused_group(cfgs: list, data_dir, threads: int = 0, mode: str | None = None,
                share_input: bool = True, say=print) -> FusedGroup:
    """A fused group of the runs ``cfgs`` (TrainConfigs, one strategy), built in this process
    from scratch with nothing written: what benchmarks and tests step and profile."""
    from pathlib import Path

    from .segment import Segment
    from .strategies import get_strategy

    members = [Segment(cfg, get_strategy(cfg.strategy)(cfg, threads), Path(data_dir),
                       Path("/nonexistent")) for cfg in sorted(cfgs, key=lambda c: c.optimizer)]
    for m in members:
        m.strategy.setup()
    mode = build_members(members, mode)
    return FusedGroup(members, mode, say,
                      FusedBatches([m.batches for m in members], share_input))
