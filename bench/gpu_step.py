"""One run's training step against a hand-written loop on the same device (issue 26 item 3:
the engine at >= 0.95x hand-written speed, deterministic or not).

Cases, each in a process of its own (the deterministic switches are process-global):

  hand-written   ~50 lines below: the split as a uint8 tensor on the device, a randperm per
                 epoch, index_select + float normalise + channels_last, the project's lenet,
                 SGD momentum 0.9, cross_entropy, no host sync inside an epoch
  engine         the segment job's own command line (strategy launcher + `cifarflow train`
                 with the workflow's arguments) for strategy gpu (cpu without CUDA), planned
                 from a config as the workflow plans it
  engine ddp x2  the same through torchrun on 2 GPUs, when 2 or more are visible

each with train.deterministic true ("deterministic": torch.use_deterministic_algorithms,
CUBLAS_WORKSPACE_CONFIG=:4096:8, cudnn.benchmark off) and false (cudnn.benchmark on). The
hand-written loop sets these switches with the engine's own functions from the engine's
planned config (seed_everything, apply_cuda_switches: fill_uninitialized_memory off, TF32 as
configured), so the ratio compares steps, not switches; each case records its switches.
Same data (synthetic, CIFAR format), model, batch size, lr and momentum everywhere.

images/s = the mean over the steady epochs (2..N) of each epoch's images / seconds; the
hand-written loop synchronises the device only at epoch ends, before reading the clock; the
engine's figure is its metrics.jsonl (as bench/gpu_sweep.py reads it). Each case runs
--reps times, interleaved; the table gives the median and engine / hand-written per mode.

    PYTHONPATH=scripts python bench/gpu_step.py          # CUDA: 50,000 images, bs 512, 4 epochs
    PYTHONPATH=scripts python bench/gpu_step.py --small  # CPU: 4,000 images, bs 256, 3 epochs
    PYTHONPATH=scripts python bench/gpu_step.py --modes deterministic --reps 2 --out DIR

Needs torch and pyyaml, not snakemake. Writes gpu_step.json in --out (bench/out). Throughput
of a whole sweep (fused packs, MPS) on one device: bench/gpu_sweep.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import gpu_sweep  # noqa: E402  (puts scripts/ on sys.path)
from gpu_sweep import ENV, ROOT  # noqa: E402

from cifarflow.layout import RunPaths  # noqa: E402
from cifarflow.orders import SegmentOrder  # noqa: E402

OUT = ROOT / "bench" / "out"  # gpu_step.json here, the runs in gpu_step/
MODES = {"deterministic": True, "nondeterministic": False}
TARGET = 0.95  # engine / hand-written, per mode
MIN_STEPS = 20  # steps an epoch below which engine / hand-written is not shown (the smoke)


def switches() -> dict:
    """The process-global switches a step's speed depends on, as they are now."""
    import torch
    import torch.utils.deterministic

    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}


def hand_written(spec: str, batches: str, epochs: int, batch_size: int, threads: int) -> dict:
    """The reference loop, in this process, under the switches the engine sets for the run
    ``spec`` (the engine's own functions: they are process-global)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch
    import torch.nn.functional as F

    from cifarflow.config import TrainConfig
    from cifarflow.data import load_split
    from cifarflow.engine.build import seed_everything
    from cifarflow.engine.gpu_monitor import GpuSampler, nvml_reader
    from cifarflow.engine.models import build_model
    from cifarflow.engine.strategies.base import apply_cuda_switches

    cfg = TrainConfig.read(spec)
    lr, momentum = cfg.lr, cfg.momentum
    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        apply_cuda_switches(cfg)  # before cuBLAS starts, as the strategy's setup
    seed_everything(cfg.seed, cfg.deterministic, cfg.compile)
    x_np, y_np = load_split(Path(batches), train=True)
    images, labels = torch.from_numpy(x_np).to(device), torch.from_numpy(y_np).to(device)
    model = build_model("lenet").to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    read = nvml_reader(device)[0] if device == "cuda" else None
    sampler = GpuSampler(read).start() if read else None
    n, per_epoch, util = len(labels), [], []
    for epoch in range(epochs):
        if device == "cuda":
            torch.cuda.synchronize()
        if sampler:
            sampler.take()
        t0 = time.perf_counter()
        order = torch.randperm(n, device=device)
        for start in range(0, n, batch_size):
            sel = order[start:start + batch_size]
            x = images.index_select(0, sel).float().mul_(1 / 127.5).sub_(1.0)  # (x/255-.5)/.5
            x = x.contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(model(x), labels.index_select(0, sel))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        per_epoch.append(n / (time.perf_counter() - t0))
        if sampler:
            util.append(sampler.take()["gpu_util_pct"])
    if sampler:
        sampler.stop()
    return {"epochs_images_per_sec": per_epoch, "final_loss": loss.detach().item(),
            "gpu_util_pct": mean_or_none(util[1:] or util), "switches": switches()}


def mean_or_none(values: list):
    return statistics.mean(values) if values and None not in values else None


def run_hand_written(mode: str, batches: Path, cfg, args) -> dict:
    """The loop in a fresh process, under the engine's switches for ``cfg`` (the engine
    run's config); its last stdout line is its JSON figure."""
    spec = args.out / "gpu_step" / f"hand-written-{mode}.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    cfg.write(spec)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--hand-written", str(spec), "--data",
                          str(batches), "--epochs", str(args.epochs), "--batch-size",
                          str(args.batch_size), "--threads", str(args.threads)],
                         env=ENV, check=True, stdout=subprocess.PIPE, text=True)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    epochs = rec["epochs_images_per_sec"]
    return {**rec, "images_per_sec": statistics.mean(epochs[1:] or epochs),
            "wall_s": time.perf_counter() - t0}


def segment_argv(results: Path, batches: Path, run, threads: int) -> list[str]:
    """What the workflow's segment job runs for segment 1 of ``run`` (WorkflowPlan's
    segment command with env.mode current): the strategy's launcher, then the segment's
    order (`cifarflow train`)."""
    paths = RunPaths(str(results), run.name)
    request = run.policy.request([], run.until_epoch(1), 0)
    prefix = run.strategy_class.command_prefix(sys.executable, run).split()
    order = SegmentOrder.of_segment(paths, 1, data=str(batches), until_epoch=run.until_epoch(1),
                                    stage="none", threads=threads, budget_min=request.runtime,
                                    mem_mb=request.mem_mb, attempt=1)
    return [*prefix, *order.command()]


def run_engine(results: Path, batches: Path, run, threads: int) -> dict:
    shutil.rmtree(Path(RunPaths(str(results), run.name).root), ignore_errors=True)
    run.config.write(RunPaths(str(results), run.name).spec)
    t0 = time.perf_counter()
    subprocess.run(segment_argv(results, batches, run, threads), env=ENV, check=True,
                   stdout=subprocess.DEVNULL)
    rows = gpu_sweep.steady_epochs(results, run.name)
    return {"images_per_sec": statistics.mean(r["images_per_sec"] for r in rows),
            "epochs_images_per_sec": [r["images_per_sec"] for r in rows],
            "gpu_util_pct": mean_or_none([r["gpu_util_pct"] for r in rows]),
            "wall_s": time.perf_counter() - t0}


def plan_engine(device: str, args, gpus: int) -> dict:
    """(case, mode) -> (results dir, planned run), planned as the workflow plans them."""
    planned = {}
    for mode in args.modes:
        deterministic = MODES[mode]
        sizes = argparse.Namespace(images=args.images, epochs=args.epochs,
                                   deterministic=deterministic,
                                   batch_size={"lenet": args.batch_size})
        cases = [("engine", "", None)]
        if gpus >= 2 and not args.no_ddp:
            cases.append(("engine ddp x2", "ddp",
                          {"distributed": {"device": "cuda", "world_size": 2}}))
        for case, strategy, sections in cases:
            results = args.out / "gpu_step" / "runs" / f"{case.replace(' ', '-')}-{mode}"
            runs = gpu_sweep.plan(results, "lenet", 1, device, sizes, strategy, sections)
            planned[case, mode] = (results, next(iter(runs.values())))
    return planned


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a CPU-sized run")
    ap.add_argument("--images", type=int, help="training images (50,000 full, 4,000 small)")
    ap.add_argument("--epochs", type=int, help="epochs per run (4 full, 3 small); epoch 1 "
                    "is the warm-up")
    ap.add_argument("--batch-size", type=int, help="512 full, 256 small")
    ap.add_argument("--reps", type=int, default=3, help="runs of each case, interleaved")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-ddp", action="store_true", help="skip the 2-rank ddp case")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--out", type=Path, default=OUT, help="where the figures and runs go")
    ap.add_argument("--hand-written", metavar="SPEC", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hand_written:  # the child process of run_hand_written
        print(json.dumps(hand_written(args.hand_written, args.data, args.epochs, args.batch_size,
                                      args.threads)))
        return
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    if device == "cpu" and not args.small:
        print("no CUDA device: running the full sizes on CPU (--small for a CPU-sized run)")
    args.images = args.images or (4000 if args.small else 50000)
    args.epochs = args.epochs or (3 if args.small else 4)
    args.batch_size = args.batch_size or (256 if args.small else 512)
    if args.no_ddp:
        ddp_note = "ddp skipped (--no-ddp)"
    elif gpus < 2:
        ddp_note = f"ddp x2 skipped: {gpus} GPU(s) visible, it needs 2"
    else:
        ddp_note = ""
    if ddp_note:
        print(ddp_note)
    batches = gpu_sweep.dataset(args.images, args.out)
    planned = plan_engine(device, args, gpus)
    rows = []

    def record(case: str, mode: str, rep: int, measure) -> None:
        """One run of a case; a failed one is recorded and the others still run (a GPU
        session may have one go at this script)."""
        try:
            figure = measure()
        except subprocess.CalledProcessError as exc:
            rows.append({"case": case, "mode": mode, "rep": rep, "error": str(exc)})
            print(f"rep {rep} {case:14s} {mode:16s} FAILED: {exc} (its stderr is above)",
                  flush=True)
            return
        rows.append({"case": case, "mode": mode, "rep": rep, **figure})
        util = (f", GPU {figure['gpu_util_pct']:.0f}% busy"
                if figure["gpu_util_pct"] is not None else "")
        print(f"rep {rep} {case:14s} {mode:16s} {figure['images_per_sec']:>10,.0f} img/s "
              f"({figure['wall_s']:.1f} s{util})", flush=True)

    for rep in range(1, args.reps + 1):
        for mode in args.modes:
            cfg = planned["engine", mode][1].config  # the hand-written loop's lr and momentum
            record("hand-written", mode, rep, lambda: run_hand_written(mode, batches, cfg, args))
            for (case, m), (results, run) in planned.items():
                if m == mode:
                    threads = max(1, args.threads // run.config.world_size)  # per rank
                    record(case, mode, rep, lambda: run_engine(results, batches, run, threads))
    summary = summarise(rows)
    steps = -(-args.images // args.batch_size)
    no_ratio = ""
    if steps < MIN_STEPS:  # the figures stay; a ratio of them would say nothing of the step
        no_ratio = (f"{steps} steps an epoch (< {MIN_STEPS}): the engine's per-epoch work "
                    "outside the step (its clock's syncs, the stop decision, the epoch's "
                    "record) weighs as much as the steps themselves; no ratio")
        for s in summary:
            s.pop("vs_hand_written", None)
            s.pop("vs_engine", None)
        print(f"engine / hand-written not shown: {no_ratio}")
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "gpus_visible": gpus, "torch": torch.__version__, "threads": args.threads,
              "images": args.images, "epochs": args.epochs, "batch_size": args.batch_size,
              "reps": args.reps, "target": TARGET, "ddp": ddp_note or "measured",
              "summary": summary, "runs": rows, "no_ratio": no_ratio}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_step.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{result['device']}, torch {torch.__version__}, {args.images:,} images, batch "
          f"{args.batch_size}, {args.epochs} epochs (steady: 2..{args.epochs}), median of "
          f"{args.reps}\n")
    print("| case | mode | images/s | runs | GPU busy | engine / hand-written |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for s in summary:
        util = f"{s['gpu_util_pct']:.0f}%" if s["gpu_util_pct"] is not None else "-"
        ratio = f"**{s['vs_hand_written']:.2f}x**" if "vs_hand_written" in s else ""
        if "vs_engine" in s:
            ratio = f"{s['vs_engine']:.2f}x the one-GPU engine (2 GPUs)"
        runs = ", ".join(f"{v:,}" for v in s["runs_images_per_sec"])
        print(f"| {s['case']} | {s['mode']} | {s['images_per_sec']:,.0f} | {runs} | {util} | "
              f"{ratio} |")
    for s in summary:
        if s["case"] == "engine" and "vs_hand_written" in s:
            verdict = "met" if s["vs_hand_written"] >= TARGET else "missed"
            print(f"target engine >= {TARGET}x hand-written, {s['mode']}: "
                  f"{s['vs_hand_written']:.2f}x, {verdict}")
    if ddp_note:
        print(ddp_note)
    failed = [f"{r['case']} {r['mode']} rep {r['rep']}" for r in rows if "error" in r]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        sys.exit(1)


def summarise(rows: list[dict]) -> list[dict]:
    """Median images/s per (case, mode) over the reps; engine cases / hand-written."""
    measured = [r for r in rows if "error" not in r]
    keys = list(dict.fromkeys((r["case"], r["mode"]) for r in measured))
    summary = []
    for case, mode in keys:
        mine = [r for r in measured if (r["case"], r["mode"]) == (case, mode)]
        summary.append({"case": case, "mode": mode,
                        "images_per_sec": statistics.median(r["images_per_sec"] for r in mine),
                        "runs_images_per_sec": [round(r["images_per_sec"]) for r in mine],
                        "gpu_util_pct": mean_or_none([r["gpu_util_pct"] for r in mine])})
    hand = {s["mode"]: s["images_per_sec"] for s in summary if s["case"] == "hand-written"}
    engine = {s["mode"]: s["images_per_sec"] for s in summary if s["case"] == "engine"}
    for s in summary:
        if s["case"] != "hand-written" and s["mode"] in hand:
            s["vs_hand_written"] = round(s["images_per_sec"] / hand[s["mode"]], 3)
        if s["case"] not in ("hand-written", "engine") and s["mode"] in engine:
            s["vs_engine"] = round(s["images_per_sec"] / engine[s["mode"]], 3)  # ddp scaling
    return summary


if __name__ == "__main__":
    main()
