"""Where a run's and a pack's files live under ``results/``: the one copy of the path
templates, for the workflow (common.smk) and the jobs (the pack driver) alike."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class RunPaths:
    results: str
    run: str

    @property
    def root(self) -> str:
        return f"{self.results}/runs/{self.run}"

    @property
    def spec(self) -> str:
        return f"{self.root}/spec.json"

    @property
    def work(self) -> str:
        """The in-segment checkpoint a killed or preempted segment resumes from."""
        return f"{self.root}/work"

    @property
    def tensorboard(self) -> str:
        return f"{self.results}/tensorboard/{self.run}"

    def segment(self, k: int) -> str:
        return f"{self.root}/segment-{k}"

    @property
    def logs(self) -> str:
        """Its training logs: segment-<k>.log, and one per try of a segment beside it."""
        return f"{self.results}/logs/train/{self.run}"

    def log(self, k: int) -> str:
        return f"{self.logs}/segment-{k}.log"


def pack_marker(results: str, pack: str, k: int) -> str:
    """What a pack's segment job writes last: which members it trained, and how."""
    return f"{results}/packs/{pack}/segment-{k}.json"


def segment_number(path) -> int | None:
    found = re.search(r"segment-(\d+)", str(path))
    return int(found.group(1)) if found else None
