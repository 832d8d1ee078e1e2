"""The orders the controller sends across a process boundary: one frozen dataclass per kind
of job (a segment of one run, a pack's segment, a fused group's segment). The controller
builds an order, ``to_argv()`` writes it as a command line, the CLI reads it back with
``from_args()`` and hands the one object on: to the job (job/pack.py, job/fused_pack.py) and
the engine (engine/segment.py). A field is declared once, with its help: the command's
options are made from the fields (``add_arguments``), so an option cannot be written in one
place and read under another name in the next. No torch here.

A field's value may be a Snakemake placeholder (``{resources.runtime}``) where the rule
fills in what a retry changes: ``to_argv`` writes every value as text.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from .layout import RunPaths

STAGES = ("auto", "slurm_tmpdir", "none")  # data.stage
FUSE_MODES = ("auto", "vmap", "loop")       # pack.fuse: auto is vmap on CUDA, loop on CPU


def option(help: str, **argparse_kw):
    """A field that is a command-line option (``--name-with-dashes``)."""
    return field(metadata={"help": help, **argparse_kw}, **(
        {"default": argparse_kw["default"]} if "default" in argparse_kw else {}))


@dataclass(frozen=True)
class Order:
    """What every order shares: its command, its options made from its fields."""

    COMMAND: ClassVar[str] = ""
    HELP: ClassVar[str] = ""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        for f in fields(cls):
            meta = dict(f.metadata)
            flag = "--" + f.name.replace("_", "-")
            help_text = meta.pop("help")
            if f.type in ("bool", bool):
                parser.add_argument(flag, action="store_true", help=help_text)
                continue
            kind = {"int": int, "float": float}.get(str(f.type).split(" |")[0])
            if str(f.type).startswith("tuple"):
                meta["nargs"] = "+"
            elif kind:
                meta["type"] = kind
            if "default" not in meta:
                meta["required"] = True
            parser.add_argument(flag, dest=f.name, help=help_text, **meta)

    @classmethod
    def from_args(cls, args: argparse.Namespace):
        values = {f.name: getattr(args, f.name) for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def to_argv(self, leave=()) -> list[str]:
        """The order as ``cifarflow <command>``'s options (not the command itself), but the
        fields named in ``leave`` (a rule's template fills them in: rule_command)."""
        argv, last = [], []
        for f in fields(self):
            value, flag = getattr(self, f.name), "--" + f.name.replace("_", "-")
            if value is None or value is False or f.name in leave:
                continue
            if value is True:
                argv.append(flag)
            elif isinstance(value, tuple):
                last += [flag, *map(str, value)]  # nargs="+" last: nothing follows it
            else:
                argv += [flag, str(value)]
        return argv + last

    @classmethod
    def rule_command(cls, fixed: str, **filled: str) -> str:
        """The order as a Snakemake shell template: ``fixed`` (a placeholder of the rule's
        params holding the job's ``to_argv(leave=filled)``), then each field of ``filled``
        from its placeholder: what a retry changes (resources) is never a param, which
        Snakemake keeps from the first try."""
        for name in filled:
            assert name in {f.name for f in fields(cls)}, name
        return " ".join([cls.COMMAND, fixed, *(f"--{name.replace('_', '-')} {value}"
                                              for name, value in filled.items())])

    def command(self, python: str = sys.executable) -> list[str]:
        """This process's Python running the order: a job starting a member or a group."""
        return [python, "-m", "cifarflow", self.COMMAND, *self.to_argv()]

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class SegmentOrder(Order):
    """`cifarflow train`: segment k of one run. Where it reads and writes, its target epoch
    and what its try's job got; all else is in the run's spec.json."""

    COMMAND: ClassVar[str] = "train"
    HELP: ClassVar[str] = "train one segment of a run"
    spec: str = option("the run's spec.json (written by the workflow)")
    data: str = option("the cifar-10-batches-py directory")
    out: str = option("checkpoint directory this segment writes")
    resume: str | None = option("previous segment's checkpoint directory", default=None)
    work: str | None = option("directory for in-segment checkpoints", default=None)
    until_epoch: int | None = option("the epoch this segment trains to", default=None)
    stage_data: str = option("read a node-local copy of --data (config data.stage)",
                             default="none", choices=STAGES)
    tensorboard: str | None = option("the run's TensorBoard directory (rank 0 writes event "
                                     "files there); none: no event files", default=None)
    # what this try's job got (the rule passes Snakemake's placeholders: a retry changes them)
    threads: int = option("threads (cores) of each process", default=0)
    budget_min: float | None = option("time budget in minutes (the rule's runtime); the "
                                      "spec's budget_s applies if smaller", default=None)
    mem_mb: int | None = option("memory the job asked for per node (recorded next to what "
                                "the segment used)", default=None)
    attempt: int = option("Snakemake's attempt (retries)", default=1)

    @classmethod
    def of_segment(cls, paths: RunPaths, k: int, *, data: str, until_epoch: int, stage: str,
                   **try_of) -> "SegmentOrder":
        """Segment k of the run at ``paths``: resumed from k-1 where k > 1."""
        return cls(spec=paths.spec, data=data, out=paths.segment(k),
                   resume=paths.segment(k - 1) if int(k) > 1 else None, work=paths.work,
                   until_epoch=until_epoch, stage_data=stage, tensorboard=paths.tensorboard,
                   **try_of)

    @property
    def run_dir(self) -> Path | None:
        """results/runs/<run>: its tries and its work checkpoint (None without --work)."""
        return Path(self.work).parent if self.work else None


@dataclass(frozen=True)
class GroupOrder(Order):
    """What an order of several runs' segment k shares: which pack, where they read and
    write, their target epoch."""

    pack: str = option("the pack's name")
    segment: int = option("the segment the members train")
    results: str = option("the workflow's results directory")
    data: str = option("the cifar-10-batches-py directory")
    until_epoch: int = option("the epoch the segment trains to")


@dataclass(frozen=True)
class PackOrder(GroupOrder):
    """`cifarflow train-pack`: segment k of a pack's members, each as its own process (a
    Slurm step each), or as one fused process (``fuse``), or M to a GPU under MPS."""

    COMMAND: ClassVar[str] = "train-pack"
    HELP: ClassVar[str] = "train one segment of several runs at once (a pack)"
    stage_data: str = option("read a node-local copy of --data", default="none",
                             choices=STAGES)
    gpus: int = option("GPUs per member (Slurm)", default=0)
    fuse: str | None = option("train the members as one fused model in one process "
                              "(pack.fuse)", default=None, choices=FUSE_MODES)
    per_gpu: int = option("members sharing each GPU through one private MPS daemon "
                          "(pack.per_gpu)", default=1)
    in_step: bool = option("inside the one Slurm step of an MPS-shared pack: start the "
                           "daemon and the members here", default=False)
    # what this try's job got
    threads: int = option("cores per member", default=1)
    budget_min: float = option("time budget in minutes", default=0.0)
    mem_per_cpu: int = option("MB, per member's core (Slurm)", default=0)
    slots: int = option("cores of the job outside Slurm", default=1)
    record: str = option("the pack's record, written last", default="")
    members: tuple = option("the runs this job trains", default=())

    def member(self, run: str, attempt: int) -> SegmentOrder:
        """A member's own `cifarflow train`, exactly as an unpacked segment job runs it."""
        return SegmentOrder.of_segment(
            RunPaths(self.results, run), self.segment, data=self.data,
            until_epoch=self.until_epoch, stage=self.stage_data, threads=self.threads,
            budget_min=self.budget_min, mem_mb=self.mem_per_cpu * self.threads,
            attempt=attempt)

    def fused(self, members: list[str], status: Path) -> "FusedOrder":
        """The fused group's one process, for the members not yet published."""
        return FusedOrder(pack=self.pack, segment=self.segment, results=self.results,
                          data=self.data, until_epoch=self.until_epoch,
                          stage_data=self.stage_data, mode=self.fuse or "auto",
                          threads=self.threads, budget_min=self.budget_min,
                          mem_mb=self.mem_per_cpu * self.threads, status=str(status),
                          members=tuple(members))


@dataclass(frozen=True)
class FusedOrder(GroupOrder):
    """`cifarflow train-fused`: segment k of a fused group's members in this process."""

    COMMAND: ClassVar[str] = "train-fused"
    HELP: ClassVar[str] = ("train one segment of a fused pack's members in this process "
                           "(started by train-pack --fuse)")
    status: str = option("where each member's outcome is written (JSON)")
    stage_data: str = option("read a node-local copy of --data", default="none",
                             choices=STAGES)
    mode: str = option("vmap: grouped convolutions; loop: one member after the other; "
                       "auto: vmap on CUDA, loop on CPU", default="auto", choices=FUSE_MODES)
    no_shared_input: bool = option("gather each member's batch even where members share "
                                   "one order (benchmarks)", default=False)
    threads: int = option("cores of the process", default=0)
    budget_min: float = option("time budget in minutes", default=0.0)
    mem_mb: int = option("memory of the process (MB)", default=0)
    members: tuple = option("the runs this process trains", default=())

    def member(self, run: str, attempt: int) -> SegmentOrder:
        """A member's segment, as it would train alone (its paths, this try's request)."""
        return SegmentOrder.of_segment(
            RunPaths(self.results, run), self.segment, data=self.data,
            until_epoch=self.until_epoch, stage=self.stage_data, threads=self.threads,
            budget_min=self.budget_min, mem_mb=self.mem_mb, attempt=attempt)


ORDERS = (SegmentOrder, PackOrder, FusedOrder)
