"""Aggregate throughput of a sweep of small models on one device: one run at a time, M runs
sharing the GPU (MPS on CUDA, plain processes on CPU), and fused packs of K members.

Every case runs the project's own commands on the project's own data format: `cifarflow
train` for one run, M of them at once under one private MPS daemon (`cifarflow mps-run`),
`cifarflow train-fused` for a fused pack: whole segments with metrics and checkpoints.

Aggregate images/s = the sum, over the members of a fused pack, of each one's mean
``images_per_sec`` over its steady epochs (2 onwards; epoch 1 is the warm-up: CUDA context,
cuDNN autotuning: the members share one clock); for runs side by side in processes of their
own (MPS), the images of their steady epochs over the union of those epochs' training
windows (started_at..ended_at in metrics.jsonl), with the share of it in which all trained
at once ("overlap"); for one at a time it is the mean of the runs' figures.

    python bench/gpu_sweep.py                 # CUDA: 50,000 images, lenet bs 512 + resnet18
    python bench/gpu_sweep.py --small         # CPU-sized: 4,000 images, K up to 8
    python bench/gpu_sweep.py --cases alone fused:8 fused-own:16 mps:4

A case is ``[model/]kind[:count]``: alone, mps:M, fused:K (one shared batch: the members
differ in lr only), fused-own:K (each member gathers its own batch), fused-vmap:K,
fused-loop:K. Each case runs in its own processes: a failure is recorded with its error and
the others go on; gpu_sweep.json and .md are rewritten in --out (bench/out) after every
case. One run's step against a hand-written loop on the same device: bench/gpu_step.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from cifarflow import data  # noqa: E402
from cifarflow.config import with_defaults  # noqa: E402
from cifarflow.layout import RunPaths  # noqa: E402
from cifarflow.controller.plan import build_runs  # noqa: E402

OUT = ROOT / "bench" / "out"  # gpu_sweep.json and .md here, the runs and data in gpu_sweep/
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), "PYTHONUNBUFFERED": "1"}
FULL = ["alone", "mps:4", "mps:8", "fused:8", "fused:16", "fused:32", "fused:64",
        "fused-own:16", "fused-own:64", "resnet18/alone", "resnet18/fused:4", "resnet18/fused:8"]
SMALL = ["alone", "mps:2", "fused:2", "fused:4", "fused:8", "fused-own:4", "fused-vmap:4"]


def dataset(size: int, out: Path = OUT) -> Path:
    """A synthetic split of ``size`` training images, made once under ``out``."""
    root = out / "gpu_sweep" / f"data-{size}"
    if not root.is_dir():  # made aside, then renamed: a run cut off leaves no half of it
        making = root.with_name(root.name + ".making")
        subprocess.run(["rm", "-rf", str(making)], check=True)
        archive = data.prepare_archive("synthetic", making, synthetic={
            "train_size": size, "test_size": max(1000, size // 5)})
        data.extract_archive(archive, making)
        making.rename(root)
    return root / "cifar-10-batches-py"


def plan(results: Path, model: str, runs: int, device: str, args, strategy: str = "",
         sections: dict | None = None) -> dict:
    """`runs` members that differ in lr (a sweep), planned as the workflow plans them: name
    -> planned run. ``strategy`` defaults to the device's one-process strategy (gpu, cpu);
    ``sections`` adds config sections (e.g. distributed for ddp)."""
    config = with_defaults({
        "strategies": [strategy or ("gpu" if device == "cuda" else "cpu")],
        "data": {"synthetic": {"train_size": args.images, "test_size": max(1000, args.images // 5)}},
        "train": {"model": model, "epochs": args.epochs, "batch_size": args.batch_size[model],
                  "log_interval_s": 1000, "deterministic": args.deterministic},
        "sweep": {"lr": [round(0.01 + 0.001 * i, 4) for i in range(runs)]}, **(sections or {})})
    planned = build_runs(config)
    for name, run in planned.items():
        run.config.write(RunPaths(str(results), name).spec)
    return planned


def train_argv(results: Path, batches: Path, run: str, threads: int) -> list[str]:
    paths = RunPaths(str(results), run)
    return [sys.executable, "-m", "cifarflow", "train", "--spec", paths.spec, "--data",
            str(batches), "--out", paths.segment(1), "--threads", str(threads)]


def steady_epochs(results: Path, run: str) -> list[dict]:
    """The metrics.jsonl records of segment 1's steady epochs (2 onwards; all if only one)."""
    rows = [json.loads(line) for line in
            (Path(RunPaths(str(results), run).segment(1)) / "metrics.jsonl").read_text().splitlines()]
    return rows[1:] or rows


def steady(results: Path, run: str) -> float:
    return statistics.mean(r["images_per_sec"] for r in steady_epochs(results, run))


def side_by_side(results: Path, runs) -> dict:
    """Runs that trained at the same time, counted over the union of their steady epochs'
    training windows (each record's started_at..ended_at): images / union seconds, so
    a replica that trained while the others had not started (or had finished) is counted
    as the time it took, not as a rate that adds to theirs; and the share of that union in
    which every run trained at once."""
    windows, images = [], 0.0
    for run in runs:
        for r in steady_epochs(results, run):
            windows.append((r["started_at"], r["ended_at"]))
            images += r["images_per_sec_per_rank"] * r["wall_s"]
    union = together = 0.0
    events = sorted([(a, 1) for a, _ in windows] + [(b, -1) for _, b in windows])
    training, last = 0, None
    for t, step in events:
        if last is not None and training:
            union += t - last
            if training == len(runs):
                together += t - last
        training, last = training + step, t
    return {"images_per_sec": images / union, "union_s": round(union, 2),
            "overlap": round(together / union, 3)}


def run_case(case: str, device: str, batches: Path, args) -> dict:
    model, _, how = case.rpartition("/")
    model = model or "lenet"
    kind, _, count = how.partition(":")
    count = int(count or 1)
    results = args.out / "gpu_sweep" / "runs" / case.replace("/", "-").replace(":", "-")
    subprocess.run(["rm", "-rf", str(results)], check=True)
    runs = plan(results, model, count if kind != "alone" else args.alone_runs, device, args)
    t0 = time.perf_counter()
    extra = {}
    if kind == "alone":
        for run in runs:
            subprocess.run(train_argv(results, batches, run, args.threads), env=ENV, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        images_per_sec = statistics.mean(steady(results, run) for run in runs)
    elif kind == "mps":
        lines = [" ".join(train_argv(results, batches, run, max(1, args.threads // count)))
                 + " > /dev/null & pids+=($!)" for run in runs]
        # each member's exit code, not only the last's: a failed member fails the case
        script = "\n".join(["pids=()", *lines, "failed=0",
                            'for p in "${pids[@]}"; do wait "$p" || failed=1; done',
                            "exit $failed"])
        prefix = ([sys.executable, "-m", "cifarflow", "mps-run", "--replicas", str(count), "--"]
                  if device == "cuda" else [])
        # every replica's first batch once all have CUDA up, the model built and the data in
        barrier = f"{results / 'start-barrier'}:{count}"
        subprocess.run(prefix + ["bash", "-c", script], check=True,
                       env={**ENV, "CIFARFLOW_START_BARRIER": barrier})
        extra = side_by_side(results, runs)  # not the sum of rates: skewed runs would add up
        images_per_sec = extra.pop("images_per_sec")
    else:
        options = kind.split("-")[1:]
        mode = next((o for o in options if o in ("vmap", "loop")), "auto")
        status = results / "status.json"
        subprocess.run([sys.executable, "-m", "cifarflow", "train-fused", "--pack", case,
                        "--segment", "1", "--results", str(results), "--data", str(batches),
                        "--until-epoch", str(args.epochs), "--threads", str(args.threads),
                        "--mode", mode, "--status", str(status),
                        *(["--no-shared-input"] if "own" in options else []),
                        "--members", *runs],
                       env=ENV, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
        failed = {r: s for r, s in json.loads(status.read_text()).items() if s["exit"]}
        if failed:
            raise SystemExit(f"{case}: members failed: {failed}")
        images_per_sec = sum(steady(results, run) for run in runs)
    return {"case": case, "model": model, "kind": kind, "runs_at_once": count if kind != "alone" else 1,
            "images_per_sec": round(images_per_sec), "wall_s": round(time.perf_counter() - t0, 1),
            **extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a CPU-sized run")
    ap.add_argument("--cases", nargs="+", help=f"default: {' '.join(FULL)} (CUDA), "
                    f"{' '.join(SMALL)} (--small)")
    ap.add_argument("--images", type=int, help="training images (50,000 full, 4,000 small)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--alone-runs", type=int, default=2)
    ap.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out", type=Path, default=OUT, help="where the figures, runs and data go")
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.images = args.images or (4000 if args.small else 50000)
    args.batch_size = {"lenet": 512 if not args.small else 200, "resnet18": 128 if not args.small else 32}
    cases = args.cases or (SMALL if args.small else FULL)
    batches = dataset(args.images, args.out)
    header = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "threads": args.threads, "images": args.images,
              "epochs": args.epochs, "deterministic": args.deterministic}
    figures = []
    for case in cases:
        try:
            figures.append(run_case(case, device, batches, args))
            print(f"{case:20s} {figures[-1]['images_per_sec']:>12,} img/s  "
                  f"({figures[-1]['wall_s']} s)", flush=True)
        except (subprocess.CalledProcessError, SystemExit, Exception) as exc:  # noqa: BLE001
            error = getattr(exc, "stderr", None) or str(exc)
            figures.append({"case": case, "error": error.strip().splitlines()[-1][:300]
                            if error.strip() else type(exc).__name__})
            print(f"{case:20s} FAILED: {figures[-1]['error']}", flush=True)
        write(header, figures, args.out)


def write(header: dict, figures: list[dict], out: Path) -> None:
    """gpu_sweep.json and .md in ``out`` as the cases so far left them."""
    alone = {f["model"]: f["images_per_sec"] for f in figures if f.get("kind") == "alone"}
    for f in figures:
        if f.get("model") in alone and "images_per_sec" in f:
            f["vs_alone"] = round(f["images_per_sec"] / alone[f["model"]], 2)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_sweep.json").write_text(json.dumps({**header, "figures": figures},
                                                          indent=1) + "\n")
    lines = [f"# {header['device']}, torch {header['torch']}, {header['images']} images, "
             f"{header['epochs']} epochs", "",
             "| case | runs at once | images/s | vs one at a time |", "| --- | --- | --- | --- |"]
    for f in figures:
        if "error" in f:
            lines.append(f"| {f['case']} | | FAILED: {f['error']} | |")
        else:
            lines.append(f"| {f['case']} | {f['runs_at_once']} | {f['images_per_sec']:,} | "
                         f"{f.get('vs_alone', '')}x |")
    (out / "gpu_sweep.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
