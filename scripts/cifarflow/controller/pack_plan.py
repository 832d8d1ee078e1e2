"""Which runs share a pack (pack.runs_per_job): one strategy, request and segment plan per
pack; fused packs (pack.fuse) also by what one fused model needs (FUSE_KEYS); packs of a
one-GPU strategy shared through MPS (pack.per_gpu); and the order a pack's segment job
gets (PackOrder): how the pack section says its members train. The plan's runs are
plan.py's; what a kind of pack asks of Slurm is packs.py's. No torch."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.strategies import Strategy
from ..orders import PackOrder
from .plan import Run


@dataclass
class Pack:
    """Runs of one strategy and one request whose segment k one job trains at once: one
    member per task (cpus_per_task cores, and a GPU where the strategy trains on one)."""
    name: str
    strategy: str
    members: list                # run names, in plan order
    member_resources: dict       # the request of one member (what each run asks alone)
    segment_epochs: list
    kind: str = "steps"          # how its job trains the members (workflow.PACK_KINDS)
    fuse: str = ""               # fused: one process trains all (auto, vmap, loop); "": not
    member_share_mb: int = 0     # fused: memory each further member adds to the process
    per_gpu: int = 1             # members sharing one GPU through MPS (kind "mps")
    one_node: bool = True        # pack.nodes 1: the job asks --nodes=1 (GPU packs always)
    whole_node: bool = False     # pack.whole_node: the job holds its node (--exclusive)

    def order(self, k: int, members: list[str], first: Run, *, results: str, data: str,
              stage: str) -> PackOrder:
        """Segment k of the pack for ``members`` (``first``: a member, whose strategy,
        request and segment plan they share): where they read and write, how they train;
        the request is its job's (packs.PACK_TRY)."""
        return PackOrder(pack=self.name, segment=k, results=results, data=data,
                         until_epoch=first.until_epoch(k), stage_data=stage,
                         gpus=first.strategy_class.gpus_per_node(first.config),
                         fuse=self.fuse or None, per_gpu=self.per_gpu, members=tuple(members))


def packable(cls: type[Strategy]) -> bool:
    """One process per run: a pack member is one task of the job (several processes per
    member would need a step of their own geometry: those runs stay one job each)."""
    return not cls.launched


# what one fused model, its batches and its evaluation share (engine/fused/)
FUSE_KEYS = ("model", "model_args", "batch_size", "epochs", "amp", "channels_last", "augment",
             "label_smoothing", "tta")


def fuse_mode(setting) -> str:
    """pack.fuse as a fusion: "" (off), auto (vmap on CUDA, loop on CPU), vmap or loop."""
    return {False: "", True: "auto"}.get(setting, setting) if setting is not None else ""


def fusable(run: Run) -> bool:
    """A fused group holds the split in memory (the tensor loader)."""
    return run.config.loader == "tensor"


def build_packs(runs: dict[str, Run], runs_per_job: int, fuse: str = "",
                member_share_mb: int = 250) -> dict[str, Pack]:
    """Packs of at most ``runs_per_job`` runs, in plan order, of the same strategy, request
    and segment plan (never a member in a job of the wrong size). Empty for 1. Fused packs
    (``fuse``) also share what one fused model needs (FUSE_KEYS), and ask one member's
    memory plus ``member_share_mb`` per further member; runs that cannot fuse (another
    loader) form plain packs."""
    if runs_per_job <= 1:
        return {}
    groups: dict[tuple, list[Run]] = {}
    for run in runs.values():
        if packable(run.strategy_class):
            fused = bool(fuse) and fusable(run)
            shape = tuple(repr(getattr(run.config, key)) for key in FUSE_KEYS) if fused else ()
            key = (run.strategy, run.round, repr(sorted(run.resources.items())),
                   tuple(run.segment_epochs), fused, shape)
            groups.setdefault(key, []).append(run)
    packs, count = {}, {}
    for (strategy, r, _, _, fused, _), members in groups.items():
        for i in range(0, len(members), runs_per_job):
            chunk = members[i:i + runs_per_job]
            n = count[strategy, r] = count.get((strategy, r), 0) + 1
            name = f"{strategy}-r{r}-pack{n:03d}" if r else f"{strategy}-pack{n:03d}"
            packs[name] = Pack(name, strategy, [r.name for r in chunk], dict(chunk[0].resources),
                               list(chunk[0].segment_epochs), fuse=fuse if fused else "",
                               member_share_mb=member_share_mb if fused else 0)
    return packs


def describe_fusion(runs: dict[str, Run], packs: dict[str, Pack]) -> str | None:
    """One line for `snakemake -n`: how the fused packs split, and why."""
    if not packs:
        return None
    fused = [p for p in packs.values() if p.fuse]
    shapes: dict[str, int] = {}
    for pack in fused:
        cfg = runs[pack.members[0]].config
        label = f"{cfg.model} bs {cfg.batch_size}"
        shapes[label] = shapes.get(label, 0) + 1
    plain = [p for p in packs.values() if not p.fuse]
    line = (f"pack.fuse: {sum(len(p.members) for p in fused)} runs in {len(fused)} fused "
            f"pack(s) ({'; '.join(f'{label}: {n}' for label, n in shapes.items()) or 'none'})")
    if len(shapes) > 1:
        line += "; runs of another model, batch size, epochs or amp fuse apart"
    if plain:
        line += (f"; {sum(len(p.members) for p in plain)} run(s) that cannot fuse (loader "
                 f"torchvision) in {len(plain)} plain pack(s)")
    return line


def share_gpus(packs: dict[str, Pack], runs: dict[str, Run], per_gpu: int,
               runs_per_job: int) -> dict[str, Pack]:
    """pack.per_gpu: the packs of a one-GPU strategy (gpu) become MPS-shared packs (kind
    "mps"), ``per_gpu`` members on each GPU; fused packs stay as they are."""
    if per_gpu <= 1:
        return packs
    if runs_per_job <= 1:
        raise ValueError(f"pack.per_gpu: {per_gpu} shares a GPU between the members of a pack: "
                         "set pack.runs_per_job above 1")
    for pack in packs.values():
        first = runs[pack.members[0]]
        if pack.kind == "steps" and not pack.fuse and \
                first.strategy_class.gpus_per_node(first.config) == 1:
            pack.kind, pack.per_gpu = "mps", per_gpu
    return packs


def plan_packs(runs: dict[str, Run], pack: dict) -> dict[str, Pack]:
    """The packs of these runs as the config's pack section asks (build_packs, share_gpus,
    place_packs); a pack section it cannot plan raises ValueError."""
    packs = build_packs(runs, pack["runs_per_job"], fuse_mode(pack["fuse"]),
                        pack["fuse_member_mem_mb"])
    share_gpus(packs, runs, pack["per_gpu"], pack["runs_per_job"])
    return place_packs(packs, pack["nodes"], pack["whole_node"])


def place_packs(packs: dict[str, Pack], nodes, whole_node: bool) -> dict[str, Pack]:
    """pack.nodes and pack.whole_node: whether a pack's job asks one node (1) or lets Slurm
    spread its members ("any"), and whether it holds that node alone."""
    if whole_node and nodes != 1:
        raise ValueError("pack.whole_node: true holds one whole node per pack job: set "
                         "pack.nodes: 1, or pack.whole_node: false to let the members spread")
    for pack in packs.values():
        pack.one_node, pack.whole_node = nodes == 1, bool(whole_node)
    return packs
