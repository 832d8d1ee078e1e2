"""Time to the first batch's data with and without data.stage, on a CIFAR-sized split.

A synthetic split of the real size (50,000 + 10,000 images, 178 MB in the real format) is
extracted once. Then, repeated, in fresh processes: (a) the loader reads it in place,
(b) the first process of a "job" stages it into an empty node-local directory and reads
the copy, (c) a second process of the same job finds the copy, checks it and reads it.
On this machine `results/data` and the node-local directory are the same local disk, so
(b) - (a) is what staging costs; what it saves on a cluster (the shared filesystem's reads
by every rank of every job) cannot show here.

    .venv/bin/python bench/stage_data.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from cifarflow import data  # noqa: E402

PROBE = """
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
from cifarflow.engine.stage import stage_split
from cifarflow.data import load_split
where = stage_split(Path(sys.argv[1]), sys.argv[2], say=lambda m: None)
x, y = load_split(where, train=True)
print(json.dumps({"s": time.perf_counter() - t0, "images": len(y), "from": str(where)}))
"""


def probe(batches: Path, mode: str, node: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), "SLURM_TMPDIR": str(node),
           "SLURM_JOB_ID": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(batches), mode], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cifarflow-stage-"))
    archive = data.prepare_archive("synthetic", root / "data",
                                   synthetic={"train_size": 50000, "test_size": 10000})
    batches = data.extract_archive(archive, root / "data")
    size = sum(f.stat().st_size for f in batches.iterdir()) / 2**20
    times = {"in_place": [], "staged_first": [], "staged_again": []}
    for i in range(a.repeats):
        node = root / f"node{i}"
        times["in_place"].append(probe(batches, "none", node))
        times["staged_first"].append(probe(batches, "slurm_tmpdir", node))
        times["staged_again"].append(probe(batches, "slurm_tmpdir", node))
    shutil.rmtree(root)
    res = {"split_mb": round(size, 1),
           **{k: round(statistics.median(v), 3) for k, v in times.items()}}
    print(json.dumps(res))
    out = ROOT / "bench" / "out" / "stage_data.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
