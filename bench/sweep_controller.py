"""The controller's cost in a real local sweep, as the sweep grows, packed and unpacked.

A sweep of N tiny cpu runs (1 epoch, 1 segment, 1 core each, synthetic data of 500
images) runs for real under `snakemake --cores 2`. Every training job writes a Snakemake
benchmark (the job's wall time); a job holds `threads` cores (1 unpacked, the members' cores
packed) for that time, so the cores were busy for sum(s * threads) core-seconds and a
perfect controller would finish in that / cores. The controller's overhead is the rest:

    overhead = 1 - (busy core-seconds / cores) / wall time

It is measured at 50 runs and at --runs (default 300), unpacked and with pack.runs_per_job
2 (one job per 2 runs, both cores). An overhead that grows with N means the controller's
work per job grows with the sweep.

    .venv/bin/python bench/sweep_controller.py [--runs 300] [--small 50]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
CORES = 2


def config(runs: int, pack: int) -> str:
    lrs = [round(0.001 * (i + 1), 6) for i in range(runs)]
    return ("strategies: [cpu]\ndata: {source: synthetic, synthetic: {train_size: 500, "
            "test_size: 100}}\ntrain: {epochs: 1, batch_size: 100, log_interval_s: 100}\n"
            "segments: {count: 1}\nresources: {cpus_per_task: 1, mem_mb: 1000, runtime: 10}\n"
            f"sweep: {{lr: {lrs}}}\npack: {{runs_per_job: {pack}}}\n")


def busy_core_seconds(results: Path, pack: int) -> tuple[float, int]:
    """(core-seconds the training jobs held, jobs) from their benchmark files."""
    total, jobs = 0.0, 0
    for tsv in (results / "benchmarks").rglob("*.tsv"):
        row = next(csv.DictReader(open(tsv), delimiter="\t"))
        if "packs" in tsv.parts:
            record = results / "packs" / tsv.parent.name / f"{tsv.stem}.json"
            threads = len(json.loads(record.read_text())["members"])
        else:
            threads = 1
        total += float(row["s"]) * threads
        jobs += 1
    return total, jobs


def measure(runs: int, pack: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"cifarflow-sweep{runs}-"))
    (work / "c.yaml").write_text(config(runs, pack))
    base = [SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(work),
            "--configfile", str(work / "c.yaml"), "--cores", str(CORES)]
    # data and environment first: the sweep's figure is training and the controller only
    subprocess.run(base + ["extract_dataset", "record_environment"], check=True,
                   capture_output=True)
    t0 = time.perf_counter()
    out = subprocess.run(base, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"sweep of {runs} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    busy, jobs = busy_core_seconds(work / "results", pack)
    ideal = busy / CORES
    return {"runs": runs, "pack": pack, "training_jobs": jobs, "wall_s": round(wall, 1),
            "busy_core_s": round(busy, 1), "ideal_wall_s": round(ideal, 1),
            "overhead": round(1 - ideal / wall, 3),
            "wall_per_run_s": round(wall / runs, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--small", type=int, default=50)
    a = p.parse_args()
    res = [measure(n, k) for k in (1, 2) for n in (a.small, a.runs)]
    for r in res:
        print(json.dumps(r))
    out = ROOT / "bench" / "out" / "sweep_controller.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
