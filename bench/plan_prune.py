"""Planning cost of a large sweep: unpacked, packed (pack.runs_per_job), and with pruning.

`snakemake -n` of 1000 cpu runs x 10 segments (10,000+ jobs unpacked), against the same
sweep in packs of --pack runs (one job per pack and segment), the same sweep with
successive halving after segments 1..9, and Snakemake's own start-up
(`snakemake --version`). Each timed `repeats` times; the best is kept.

    .venv/bin/python bench/plan_prune.py [--runs 1000] [--segments 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} … failed:\n{out.stderr[-2000:]}")
    return time.perf_counter() - t0, out.stdout + out.stderr


def plan(config: Path, workdir: Path, repeats: int) -> dict:
    cmd = [SNAKEMAKE, "-n", "-q", "rules", "-s", str(ROOT / "Snakefile"), "--directory",
           str(workdir), "--configfile", str(config)]
    best, text = min(timed(cmd) for _ in range(repeats))
    return {"seconds": round(best, 2),
            "jobs": int(re.search(r"^total\s+(\d+)$", text, flags=re.M).group(1))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--segments", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--pack", type=int, default=8)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cifarflow-plan-"))
    lrs = [round(1e-4 * (k + 1), 6) for k in range(a.runs)]
    base = (f"strategies: [cpu]\ndata: {{source: synthetic}}\n"
            f"train: {{epochs: {a.segments}}}\nsegments: {{count: {a.segments}}}\n")
    plain, pruned, packed = work / "plain.yaml", work / "pruned.yaml", work / "packed.yaml"
    plain.write_text(base + f"sweep: {{lr: {lrs}}}\n")
    packed.write_text(base + f"sweep: {{lr: {lrs}}}\npack: {{runs_per_job: {a.pack}}}\n")
    points = list(range(1, a.segments))
    pruned.write_text(base + f"sweep: {{lr: {lrs}, prune: {{keep: 0.5, at_segments: {points}}}}}\n")
    version = min(timed([SNAKEMAKE, "--version"])[0] for _ in range(a.repeats))
    res = {"runs": a.runs, "segments": a.segments, "snakemake_start_s": round(version, 2),
           "plan_without_pruning": plan(plain, work, a.repeats),
           f"plan_packed_{a.pack}": plan(packed, work, a.repeats),
           "plan_with_pruning": plan(pruned, work, a.repeats)}
    print(json.dumps(res, indent=2))
    out = ROOT / "bench" / "out" / "plan_prune.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
