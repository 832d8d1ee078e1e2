"""sweep.search at scale against a grid of the same size (issue 36).

1. `snakemake -n` of N cpu trials x 3 segments in fused packs of 16: a random search
   (sweep.search, N samples) against a grid of N lr values. Best of `repeats`.
2. `--local R`: R trials of 1 epoch on a small synthetic set trained end to end with
   `snakemake --cores C`, the random search against an R-value lr grid, wall times.

    .venv/bin/python bench/search_scale.py [--runs 1000] [--local 200] [--cores 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
BASE = """strategies: [cpu]
data: {{source: synthetic, synthetic: {{train_size: {train}, test_size: 100, seed: 0}}}}
train: {{epochs: {epochs}, batch_size: 50, log_interval_s: 60}}
segments: {{count: {segments}}}
resources: {{cpus_per_task: 1, mem_mb: 1000, runtime: 10}}
pack: {{runs_per_job: 16, fuse: true}}
"""
SEARCH = """sweep:
  search:
    space: {{lr: {{log_uniform: [0.0001, 0.5]}}}}
    samples: {n}
"""


def configs(n: int, train: int, epochs: int, segments: int) -> dict[str, str]:
    base = BASE.format(train=train, epochs=epochs, segments=segments)
    lrs = [round(0.0001 + i * 0.5 / n, 6) for i in range(n)]
    return {"search": base + SEARCH.format(n=n), "grid": base + f"sweep: {{lr: {lrs}}}\n"}


def run(kind: str, text: str, *args) -> float:
    work = Path(tempfile.mkdtemp(prefix=f"search-{kind}-"))
    (work / "c.yaml").write_text(text)
    t0 = time.perf_counter()
    out = subprocess.run([SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(work),
                          "--configfile", str(work / "c.yaml"), *args],
                         capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{out.stderr[-3000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--local", type=int, default=0)
    ap.add_argument("--cores", type=int, default=2)
    a = ap.parse_args()
    for kind, text in configs(a.runs, 1000, 3, 3).items():
        best = min(run(kind, text, "-n") for _ in range(a.repeats))
        print(f"dry run, {a.runs} {kind} runs x 3 segments, packs of 16: {best:.1f} s", flush=True)
    if a.local:
        for kind, text in configs(a.local, 200, 1, 1).items():
            wall = run(kind, text, "--cores", str(a.cores))
            print(f"local run, {a.local} {kind} runs of 1 epoch (200 images), packs of 16 fused, "
                  f"--cores {a.cores}: {wall:.0f} s", flush=True)


if __name__ == "__main__":
    main()
