"""What a packed sweep costs the scheduler, as slurmctld counts it (sdiag, reset first), on
the test cluster (tests/slurm/cluster.sh): RPCs in all, per submitted job and per minute, by
type. Run it on a quiet cluster (nothing else submitting or querying), as root:

    .venv/bin/python bench/scheduler_rpcs.py [--checkout DIR] [--runs 24] [--per-job 2] [--fuse] [--dry-run] [--search N]

--dry-run plans without running (`snakemake -n`): what a dry run costs the scheduler.
--search N is an N-trial random search (sweep.search, 3 segments, fused packs of 16)
instead of the lr grid; its dry run plans the first round of asks (its trials are asked as
the workflow runs).

--fuse trains each pack as one fused process (`pack.fuse`): a pack of 8 one-core members
fits the test nodes' 2 cores that way (the per-job cost no longer depends on the pack).

--checkout runs another checkout's workflow (e.g. a git worktree of an older commit) for a
before/after pair on the same cluster. Prints one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "scripts"))

from cifarflow import slurm_queue  # noqa: E402

SWEEP = """strategies: [cpu]
data:
  source: synthetic
  synthetic: {{train_size: 2000, test_size: 400, seed: 0, noise: 0.35}}
train: {{epochs: 2, batch_size: 100, log_interval_s: 5}}
segments: {{count: 2}}
resources: {{cpus_per_task: 1, mem_mb: 1000, runtime: 10}}
sweep: {{lr: {lrs}}}
pack: {{runs_per_job: {per_job}, fuse: {fuse}}}
"""
SEARCH = """strategies: [cpu]
data: {{source: synthetic, synthetic: {{train_size: 2000, test_size: 100, seed: 0}}}}
train: {{epochs: 3, batch_size: 50, log_interval_s: 60}}
segments: {{count: 3}}
resources: {{cpus_per_task: 1, mem_mb: 1000, runtime: 10}}
pack: {{runs_per_job: 16, fuse: true}}
sweep:
  search:
    space: {{lr: {{log_uniform: [0.0001, 0.5]}}}}
    samples: {samples}
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkout", type=Path, default=HERE)
    p.add_argument("--runs", type=int, default=24)
    p.add_argument("--per-job", type=int, default=2)
    p.add_argument("--fuse", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--search", type=int, default=0, metavar="N")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cifarflow-rpcs-"))
    config = work / "sweep.yaml"
    config.write_text(SEARCH.format(samples=a.search) if a.search else
                      SWEEP.format(lrs=[round(0.01 * (i + 1), 4) for i in range(a.runs)],
                                   per_job=a.per_job, fuse=str(a.fuse).lower()))
    env = {**os.environ, "PYTHONPATH": str(a.checkout / "scripts"),
           "SLURM_ACCOUNT": os.environ.get("SLURM_ACCOUNT", "def-cifar")}
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(a.checkout / "Snakefile"),
           "--directory", str(work), "--configfile", str(config), "--profile",
           str(a.checkout / "profiles" / "slurm")] + (["-n"] if a.dry_run else [])
    assert slurm_queue.reset_rpc_counts(), "sdiag -r failed (run as root, the cluster up)"
    t0 = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    minutes = (time.time() - t0) / 60
    counts = slurm_queue.rpc_counts() or {}
    if out.returncode != 0:
        sys.exit(out.stderr[-3000:])
    jobs = counts.get("REQUEST_SUBMIT_BATCH_JOB", 0)
    total = sum(counts.values())
    print(json.dumps({"checkout": str(a.checkout), "runs": a.search or a.runs,
                      "dry_run": a.dry_run, "search": bool(a.search),
                      "per_job": a.per_job, "fuse": a.fuse,
                      "submitted": jobs, "rpcs": total, "minutes": round(minutes, 1),
                      "per_job_rpcs": round(total / max(jobs, 1), 1),
                      "per_minute": round(total / minutes, 1),
                      "by_type": dict(sorted(counts.items(), key=lambda kv: -kv[1]))}))


if __name__ == "__main__":
    main()
