"""GPU readiness: every CUDA path of the engine, once, on the GPUs of this machine.

    .venv/bin/python bench/gpu_check.py [--epochs 2] [--train-images 20000]

Trains synthetic CIFAR-format data through the real cli and the strategies' own launch
prefixes (launch -> torchrun, mps-run -> a private MPS daemon), one case at a time:

  gpu lenet                the seed's model on one GPU (expect an under-used GPU)
  gpu resnet18             one GPU
  gpu resnet18 compile+bf16
  ddp / fsdp resnet18      cuda + nccl, one rank per visible GPU
  mps lenet x4             4 replicas sharing GPU 0 under MPS
  lightning resnet18       Lightning on cuda, one rank per visible GPU

and prints img/s (last epoch, all ranks) and GPU utilisation (nvidia-smi sampled every
200 ms while the case runs, mean over the busy GPUs). Sized for < 8 minutes on one GPU;
writes bench/out/gpu_check/gpu_check.json. Without a GPU it says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
OUT = ROOT / "bench" / "out" / "gpu_check"
PY = sys.executable

CASES = [  # name, strategy, train settings
    ("gpu lenet", "gpu", {"model": "lenet"}),
    ("gpu resnet18", "gpu", {"model": "resnet18"}),
    ("gpu resnet18 compile+bf16", "gpu", {"model": "resnet18", "compile": True, "amp": "bf16"}),
    ("ddp resnet18", "ddp", {"model": "resnet18"}),
    ("fsdp resnet18", "fsdp", {"model": "resnet18"}),
    ("mps lenet x4", "mps", {"model": "lenet"}),
    ("lightning resnet18", "lightning", {"model": "resnet18"}),
]


class UtilSampler(threading.Thread):
    """nvidia-smi utilisation of every GPU, sampled while a case runs."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples: list[list[float]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
             "-lms", "200"], stdout=subprocess.PIPE, text=True)

    def run(self):
        for line in self.proc.stdout:
            util, mem = (float(v) for v in line.split(","))
            self.samples.append([util, mem])

    def stop(self, gpus: int) -> dict:
        self.proc.terminate()
        self.join(timeout=5)
        rows = [self.samples[i:i + gpus] for i in range(0, len(self.samples) - gpus + 1, gpus)]
        busy = [sum(r[0] for r in row) / len(row) for row in rows]
        return {"gpu_util_mean_pct": sum(busy) / len(busy) if busy else None,
                "gpu_mem_max_mb": max((r[1] for r in self.samples), default=None)}


def plan(name: str, strategy: str, settings: dict, gpus: int, epochs: int, data: dict):
    from cifarflow.config import with_defaults
    from cifarflow.controller.plan import build_runs

    config = with_defaults({
        "strategies": [strategy], "data": data,
        "train": {"epochs": epochs, "batch_size": 512, "lr": 0.05, "log_interval_s": 30,
                  **settings},
        "distributed": {"device": "cuda", "world_size": gpus},
        "mps": {"replicas": 4}, "resources": {"cpus_per_task": max(1, (os.cpu_count() or 2) // 4)}})
    run = build_runs(config)[strategy]
    spec = OUT / "specs" / f"{name.replace(' ', '_')}.json"
    run.config.write(spec)
    return run, spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-images", type=int, default=20000)
    ap.add_argument("--timeout-s", type=int, default=150, help="per case")
    a = ap.parse_args()

    import torch

    if not torch.cuda.is_available() or not shutil.which("nvidia-smi"):
        print("gpu_check: no CUDA GPU visible here (torch.cuda.is_available() is False or no "
              "nvidia-smi); run it on a GPU node", file=sys.stderr)
        sys.exit(2)
    from cifarflow import data as cdata

    gpus = torch.cuda.device_count()
    print(f"{gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}", flush=True)
    synthetic = {"train_size": a.train_images, "test_size": 2000}
    root = OUT / "data"
    archive = cdata.prepare_archive("synthetic", root, synthetic=synthetic)
    batches = cdata.extract_archive(archive, root)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), "PYTHONUNBUFFERED": "1"}
    results = []
    for name, strategy, settings in CASES:
        run, spec = plan(name, strategy, settings, gpus, a.epochs, {"synthetic": synthetic})
        out = OUT / "runs" / spec.stem
        shutil.rmtree(out, ignore_errors=True)
        prefix = run.strategy_class.command_prefix(PY, run)
        cmd = (f"{prefix} {PY} -m cifarflow train --spec {spec} --data {batches} --out {out} "
               f"--threads {run.resources['cpus_per_task']}")
        log = OUT / "logs" / f"{spec.stem}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"--- {name}: {cmd}", flush=True)
        sampler = UtilSampler()
        sampler.start()
        t0 = time.perf_counter()
        with open(log, "w") as f:
            try:
                rc = subprocess.run(shlex.split(cmd), cwd=ROOT, env=env, stdout=f,
                                    stderr=subprocess.STDOUT, timeout=a.timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        wall = time.perf_counter() - t0
        util = sampler.stop(gpus if strategy not in ("gpu", "mps") else 1)
        row = {"case": name, "strategy": strategy, "world_size": run.config.world_size,
               "rc": rc, "wall_s": wall, **util}
        metrics = out / "metrics.jsonl"
        if rc == 0 and metrics.is_file():
            last = json.loads(metrics.read_text().splitlines()[-1])
            row.update(images_per_sec=last["images_per_sec"], test_acc=last["test_acc"])
        else:
            row["error"] = log.read_text()[-800:]
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
    (OUT / "gpu_check.json").write_text(json.dumps(results, indent=1))
    print(f"\n{'case':<28}{'ranks':>6}{'img/s':>10}{'GPU util':>10}{'mem MB':>9}{'wall s':>8}")
    for r in results:
        ips = f"{r['images_per_sec']:>10,.0f}" if "images_per_sec" in r else f"{'FAILED':>10}"
        util = f"{r['gpu_util_mean_pct']:>9.0f}%" if r["gpu_util_mean_pct"] is not None else f"{'-':>10}"
        mem = f"{r['gpu_mem_max_mb']:>9.0f}" if r["gpu_mem_max_mb"] is not None else f"{'-':>9}"
        print(f"{r['case']:<28}{r['world_size']:>6}{ips}{util}{mem}{r['wall_s']:>8.0f}")
    sys.exit(0 if all(r["rc"] == 0 for r in results) else 1)


if __name__ == "__main__":
    main()
