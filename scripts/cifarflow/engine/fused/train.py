"""A fused pack's segment in one process: its members' data (once), models, optimizers and
schedules built as each would alone, resumed, and trained by the one loop (engine/loop.py)
as one fused step (step.py) per resume point; and ``fused_group``, one group's step built
in this process for benchmarks and tests."""

from __future__ import annotations

from types import SimpleNamespace

from ...orders import FusedOrder
from ..build import build_placed_model, seed_rngs, set_determinism
from ..cuda import apply_cuda_switches
from ..loop import Loop
from .model import default_mode
from .step import FusedStep


def process_switches(cfgs: list) -> SimpleNamespace:
    """One setting of the process-wide switches for all the members of a pack: deterministic
    where any member asks for it, TF32 only where every member allows it (the stricter
    setting keeps every member's promise), compile's variant of the switch where any
    compiles."""
    return SimpleNamespace(deterministic=any(c.deterministic for c in cfgs),
                           tf32_matmul=all(c.tf32_matmul for c in cfgs),
                           tf32_cudnn=all(c.tf32_cudnn for c in cfgs),
                           compile=any(c.compile for c in cfgs))


def set_process_switches(members: list, say=print) -> None:
    """The switches once for the process, from all members (each member's strategy set-up
    and the first's data loading wrote its own: the last would win); said where members
    differ."""
    switches = process_switches([m.cfg for m in members])
    if members[0].strategy.uses_cuda():
        apply_cuda_switches(switches)
    set_determinism(switches.deterministic, switches.compile)
    differ = [k for k in ("deterministic", "tf32_matmul", "tf32_cudnn")
              if len({getattr(m.cfg, k) for m in members}) > 1]
    if differ:
        say(f"members differ in {', '.join(differ)}: the pack trains with "
            + ", ".join(f"{k}={getattr(switches, k)}" for k in differ) + " for all")


def build_members(members: list, mode: str | None = None, say=print) -> str:
    """Load the data once and put it on the device ONCE (every member's batches read the
    same tensors, whatever K); build each member's model (its own seed), optimizer and
    schedule, exactly as the member would alone, under the pack's switches (set once);
    returns the fusion mode."""
    first = members[0]
    first.load_data(on_device=True)
    batches0 = first.make_batches()  # also moves the test split to the device
    set_process_switches(members, say)
    for m in members:
        if m is not first:
            m.load_data(like=first)
        seed_rngs(m.cfg.seed)
        batches = batches0 if m is first else m.make_batches()
        model = build_placed_model(m.cfg, m.strategy)
        m.attach(model, *m.make_optimizer(model.parameters(), len(batches)), batches)
    return mode or default_mode(first.strategy.device)


def train_members(order: FusedOrder, members: list, say) -> dict:
    """Segment k of each member (ledgers of one process each, not yet set up), fused as
    ``order`` (orders.FusedOrder) says: the members resumed at one position train as one
    step; members at another position (an earlier try stopped them elsewhere) form a group
    of their own, trained next, and say so. Returns each run's result, or its error (the
    others go on)."""
    members = sorted(members, key=lambda m: m.cfg.optimizer)  # a block per kind
    for m in members:
        m.strategy.setup()
    mode = build_members(members, None if order.mode == "auto" else order.mode, say)
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
        step = FusedStep(group_members, mode, say, not order.no_shared_input)
        if len(group_members) > 1:
            say("one batch shared by all members (same order)" if step.batches.shared
                else "each member its own batch order (seeds differ)")
        results.update(Loop(step, say).train())
    return results


def fused_group(cfgs: list, data_dir, threads: int = 0, mode: str | None = None,
                share_input: bool = True, say=print) -> FusedStep:
    """The fused step of the runs ``cfgs`` (TrainConfigs, one strategy), built in this process
    from scratch with nothing written: what benchmarks and tests step and profile."""
    from ...orders import SegmentOrder
    from ..segment import Segment
    from ..strategies import get_strategy

    order = SegmentOrder(spec="", data=str(data_dir), out="/nonexistent")
    members = [Segment(cfg, get_strategy(cfg.strategy)(cfg, threads), order)
               for cfg in sorted(cfgs, key=lambda c: c.optimizer)]
    for m in members:
        m.strategy.setup()
    mode = build_members(members, mode, say)
    return FusedStep(members, mode, say, share_input)
