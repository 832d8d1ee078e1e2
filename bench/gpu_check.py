"""The GPU proof in one command (issue 35): the `gpu` test suite, then the figures, from a
copy of the repository on a machine with torch + CUDA, pyyaml and tensorboard (no snakemake).

    make gpu-check                                  # or: python3 bench/gpu_check.py
    python3 bench/gpu_check.py --cpu-smoke          # the same script end to end on CPU, tiny

Stages, each in processes of its own with a time limit; a failure is recorded and the rest
go on; bench/out/gpu_check/gpu_check.json and gpu_check.md are rewritten after every case:

  tests       pytest -m gpu tests/gpu: the CUDA paths (TF32/cuDNN switches, the device from
              CIFARFLOW_CUDA_DEVICE, bf16 autocast, NVML, GPU and fused 2 segments == 1,
              one copy of the data in a fused group, nccl for ddp/fsdp, Lightning, MPS)
  strategies  every strategy through the real cli and its own launcher (launch -> torchrun,
              mps-run -> a private MPS daemon): img/s and GPU utilisation (nvidia-smi every
              200 ms)
  step        bench/gpu_step.py: the engine's step against a hand-written loop, deterministic
              and free
  sweep       bench/gpu_sweep.py: lenet one at a time, MPS-shared M = 4, 8, fused K = 8..64
              (shared batch and own batches), resnet18 alone and fused K = 4, 8

Sized for < 8 minutes on one GPU. Without a GPU (and without --cpu-smoke) it says so in one
line and exits 2. pytest is the one thing beside torch it needs; where it is missing, the
tests stage says how to bring it (pip install --target, PYTHONPATH).
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


def plan(name: str, strategy: str, settings: dict, gpus: int, epochs: int, data: dict,
         device: str = "cuda"):
    from cifarflow.config import with_defaults
    from cifarflow.controller.plan import build_runs

    config = with_defaults({
        "strategies": [strategy], "data": data,
        "train": {"epochs": epochs, "batch_size": 512, "lr": 0.05, "log_interval_s": 30,
                  **settings},
        "distributed": {"device": device, "world_size": gpus},
        "mps": {"replicas": 4}, "resources": {"cpus_per_task": max(1, (os.cpu_count() or 2) // 4)}})
    run = build_runs(config)[strategy]
    spec = OUT / "specs" / f"{name.replace(' ', '_')}.json"
    run.config.write(spec)
    return run, spec


SMOKE_CASES = [  # --cpu-smoke: the same plumbing on CPU (MPS needs CUDA: left out)
    ("cpu lenet", "cpu", {"model": "lenet"}),
    ("ddp lenet x2 gloo", "ddp", {"model": "lenet"}),
    ("lightning lenet", "lightning", {"model": "lenet"}),
]


class Record:
    """Every case's row, written out (JSON and markdown) after each one."""

    def __init__(self, header: dict):
        self.header, self.rows = header, []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        shown = {k: v for k, v in row.items() if k not in ("error", "output")}
        print(json.dumps(shown), flush=True)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "gpu_check.json").write_text(json.dumps({**self.header, "rows": self.rows},
                                                       indent=1) + "\n")
        lines = [f"# gpu_check: {self.header['device']}, torch {self.header['torch']}", "",
                 "| stage | case | result | img/s | GPU util | GPU mem MB | wall s |",
                 "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
        for r in self.rows:
            result = "ok" if r["rc"] == 0 else f"FAILED ({r['rc']}): {r.get('error', '')[-200:]}"
            ips = f"{r['images_per_sec']:,.0f}" if r.get("images_per_sec") else ""
            util = f"{r['gpu_util_mean_pct']:.0f} %" if r.get("gpu_util_mean_pct") is not None else ""
            mem = f"{r['gpu_mem_max_mb']:.0f}" if r.get("gpu_mem_max_mb") is not None else ""
            lines.append(f"| {r['stage']} | {r['case']} | {' '.join(result.split())} | {ips} | "
                         f"{util} | {mem} | {r['wall_s']:.0f} |")
        step = OUT.parent / "gpu_step.json"
        if step.is_file() and any(r["stage"] == "step" for r in self.rows):
            lines += ["", "| step | mode | images/s | vs hand-written |", "| --- | --- | ---: | ---: |"]
            lines += [f"| {c['case']} | {c['mode']} | {c['images_per_sec']:,.0f} | "
                      f"{c.get('vs_hand_written', '')} |"
                      for c in json.loads(step.read_text())["summary"]]
        sweep = OUT.parent / "gpu_sweep.md"
        if sweep.is_file() and any(r["stage"] == "sweep" for r in self.rows):
            lines += ["", sweep.read_text()]
        (OUT / "gpu_check.md").write_text("\n".join(lines) + "\n")


def run_stage(record: Record, stage: str, case: str, argv: list[str], env: dict,
              timeout_s: int) -> int:
    """One command of a stage, its output kept in logs/, its outcome recorded."""
    log = OUT / "logs" / f"{stage}-{case.replace(' ', '_').replace('/', '-')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"--- {stage}: {' '.join(map(str, argv))}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(list(map(str, argv)), cwd=ROOT, env=env, stdout=f,
                                stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    row = {"stage": stage, "case": case, "rc": rc, "wall_s": time.perf_counter() - t0}
    if rc != 0:
        row["error"] = log.read_text()[-800:]
    record.add(row)
    return 0 if rc == 0 else 1


def tests_stage(record: Record, env: dict, timeout_s: int) -> int:
    try:
        import pytest  # noqa: F401
    except ImportError as exc:
        record.add({"stage": "tests", "case": "pytest -m gpu tests/gpu", "rc": "no pytest",
                    "wall_s": 0.0, "error": f"{exc}: bring it with `pip install --target "
                    "bench/out/pydeps pytest` where pip reaches an index, then "
                    "PYTHONPATH=bench/out/pydeps"})
        return 1
    return run_stage(record, "tests", "pytest -m gpu tests/gpu",
                     [PY, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p",
                      "no:cacheprovider", "-rs"], env, timeout_s)


def strategy_stage(record: Record, a, gpus: int, smoke: bool, env: dict) -> int:
    from cifarflow import data as cdata

    synthetic = {"train_size": a.train_images, "test_size": 400 if smoke else 2000}
    root = OUT / "data"
    archive = cdata.prepare_archive("synthetic", root, synthetic=synthetic)
    batches = cdata.extract_archive(archive, root)
    failed = 0
    for name, strategy, settings in SMOKE_CASES if smoke else CASES:
        run, spec = plan(name, strategy, settings, 2 if smoke else gpus, a.epochs,
                         {"synthetic": synthetic}, "cpu" if smoke else "cuda")
        out = OUT / "runs" / spec.stem
        shutil.rmtree(out, ignore_errors=True)
        prefix = run.strategy_class.command_prefix(PY, run)
        cmd = (f"{prefix} {PY} -m cifarflow train --spec {spec} --data {batches} --out {out} "
               f"--threads {run.resources['cpus_per_task']}")
        log = OUT / "logs" / f"strategies-{spec.stem}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"--- strategies: {name}: {cmd}", flush=True)
        sampler = None if smoke else UtilSampler()
        if sampler:
            sampler.start()
        t0 = time.perf_counter()
        with open(log, "w") as f:
            try:
                rc = subprocess.run(shlex.split(cmd), cwd=ROOT, env=env, stdout=f,
                                    stderr=subprocess.STDOUT, timeout=a.timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        wall = time.perf_counter() - t0
        util = sampler.stop(gpus if strategy not in ("gpu", "mps") else 1) if sampler else {}
        row = {"stage": "strategies", "case": name, "strategy": strategy,
               "world_size": run.config.world_size, "rc": rc, "wall_s": wall, **util}
        metrics = out / "metrics.jsonl"
        if rc == 0 and metrics.is_file():
            last = json.loads(metrics.read_text().splitlines()[-1])
            row.update(images_per_sec=last["images_per_sec"], test_acc=last["test_acc"])
        else:
            row["rc"] = rc or "no metrics"
            row["error"] = log.read_text()[-800:]
            failed += 1
        record.add(row)
    return failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run every stage on CPU with tiny sizes (proves the script itself)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-images", type=int, default=20000)
    ap.add_argument("--timeout-s", type=int, default=150, help="per strategy case")
    ap.add_argument("--stages", nargs="+", default=["tests", "strategies", "step", "sweep"])
    a = ap.parse_args()

    import torch

    smoke = a.cpu_smoke
    if not smoke and (not torch.cuda.is_available() or not shutil.which("nvidia-smi")):
        print("gpu_check: no CUDA GPU visible here (torch.cuda.is_available() is False or no "
              "nvidia-smi); run it on a GPU node, or --cpu-smoke", file=sys.stderr)
        sys.exit(2)
    if smoke:
        a.train_images, a.epochs = min(a.train_images, 600), 1
    gpus = 0 if smoke else torch.cuda.device_count()
    device = "cpu (smoke)" if smoke else f"{gpus} x {torch.cuda.get_device_name(0)}"
    print(f"{device}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "scripts"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1"}
    shutil.rmtree(OUT, ignore_errors=True)
    record = Record({"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
                     "smoke": smoke})
    failed = 0
    if "tests" in a.stages:
        failed += tests_stage(record, env, 240)
    if "strategies" in a.stages:
        failed += strategy_stage(record, a, gpus, smoke, env)
    if "step" in a.stages:
        small = ["--small", "--images", "600", "--epochs", "2", "--reps", "1", "--no-ddp"] \
            if smoke else []
        failed += run_stage(record, "step", "engine vs hand-written",
                            [PY, "bench/gpu_step.py", *small], env, 600 if smoke else 240)
    if "sweep" in a.stages:
        small = ["--small", "--images", "600", "--epochs", "2", "--cases", "alone",
                 "fused:2", "fused-own:2"] if smoke else []
        failed += run_stage(record, "sweep", "sweep of small models",
                            [PY, "bench/gpu_sweep.py", *small], env, 600 if smoke else 300)
    print(f"\nwrote {OUT / 'gpu_check.md'}: {len(record.rows)} case(s), {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
