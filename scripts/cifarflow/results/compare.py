"""`cifarflow compare A B`: which runs of two results folders ended with bit-identical
weights (the same ``weights_sha256`` in their summary.csv), which differ, and which exist
on one side only. No torch: the digests were computed where each segment was published."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from .show import summary_path

IDENTICAL, DIFFERS, NO_DIGEST = "identical", "differs", "no digest"


@dataclass
class Comparison:
    """Run name -> verdict for the runs of both; the runs of one side only."""
    verdicts: dict = field(default_factory=dict)   # run -> (verdict, digest A, digest B)
    only_a: list = field(default_factory=list)
    only_b: list = field(default_factory=list)

    @property
    def all_match(self) -> bool:
        """Every common run identical, and at least one run in common."""
        return bool(self.verdicts) and all(v == IDENTICAL for v, _, _ in self.verdicts.values())


def digests(results: Path) -> dict[str, str]:
    """run -> weights_sha256 ('' where the run has none: unfinished, or an older summary)."""
    with open(summary_path(results), newline="") as f:
        return {row["run"]: row.get("weights_sha256") or "" for row in csv.DictReader(f)}


def compare(a: Path, b: Path) -> Comparison:
    left, right = digests(a), digests(b)
    out = Comparison(only_a=sorted(set(left) - set(right)),
                     only_b=sorted(set(right) - set(left)))
    for run in sorted(set(left) & set(right)):
        da, db = left[run], right[run]
        verdict = NO_DIGEST if not (da and db) else IDENTICAL if da == db else DIFFERS
        out.verdicts[run] = (verdict, da, db)
    return out


def describe(c: Comparison, a: Path, b: Path) -> str:
    """One line a run, then the counts; a digest shown by its first 16 hex digits."""
    def short(d):
        return d[:16] if d else "-"

    width = max([len(r) for r in [*c.verdicts, *c.only_a, *c.only_b]] + [3])
    lines = [f"A: {a}", f"B: {b}", ""]
    for run, (verdict, da, db) in c.verdicts.items():
        detail = short(da) if verdict == IDENTICAL else f"A {short(da)}  B {short(db)}"
        lines.append(f"{run.ljust(width)}  {verdict.ljust(9)}  {detail}")
    lines += [f"{run.ljust(width)}  only in A" for run in c.only_a]
    lines += [f"{run.ljust(width)}  only in B" for run in c.only_b]
    counts = {v: sum(1 for x, _, _ in c.verdicts.values() if x == v)
              for v in (IDENTICAL, DIFFERS, NO_DIGEST)}
    n = len(c.verdicts)
    lines += ["", f"{n} run{'' if n == 1 else 's'} in common: "
              + ", ".join(f"{n} {v}" for v, n in counts.items() if n or v == IDENTICAL)
              + f"; {len(c.only_a)} only in A, {len(c.only_b)} only in B"]
    if not c.verdicts:
        lines.append("no run in common: nothing was compared")
    elif counts[NO_DIGEST]:
        lines.append("no digest: the run has no final checkpoint, or it was published "
                     "before cifarflow recorded weights_sha256 in its manifest")
    return "\n".join(lines)
