"""Fused packs on CPU: aggregate images/s of K members fused against the same runs one at a
time, per training step, and the profile of a K = 16 step by operator (issue 35).

    .venv/bin/python bench/fused_cpu.py [--k 16] [--batch 100] [--rounds 3] [--steps 10]
        [--modes loop vmap]

One process, the engine's own objects (``engine.fused.train.fused_group``, a ``Segment``
for the run alone), synthetic CIFAR-format data; each case is timed over ``--steps`` steps
after a warm-up step, ``--rounds`` times, and the median is kept. "Alone" is one run's step;
K runs one at a time take K times as long, so the ratio is fused images/s over alone
images/s. Whole segments (data, metrics, checkpoints) through the cli: bench/gpu_sweep.py
--small. Writes bench/out/fused_cpu/fused_cpu.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402

from cifarflow import data  # noqa: E402
from cifarflow.config import with_defaults  # noqa: E402
from cifarflow.controller.plan import build_runs  # noqa: E402
from cifarflow.engine.fused.train import fused_group  # noqa: E402
from cifarflow.engine.segment import Segment  # noqa: E402
from cifarflow.engine.step import PlainStep  # noqa: E402
from cifarflow.orders import SegmentOrder  # noqa: E402
from cifarflow.engine.strategies import get_strategy  # noqa: E402

OUT = ROOT / "bench" / "out" / "fused_cpu"
# aten operators that launch no kernel (views, metadata, allocation): tests/integration/test_fused_cost.py
NO_KERNEL = {f"aten::{name}" for name in """alias as_strided as_strided_ contiguous detach
empty empty_like empty_strided expand flatten lift_fresh movedim new_empty new_empty_strided
permute reshape _reshape_alias resize_ resolve_conj resolve_neg select slice squeeze t to
transpose unflatten unsqueeze _unsafe_view view""".split()}


def dataset(size: int) -> Path:
    root = OUT / f"data-{size}"
    batches = root / "cifar-10-batches-py"
    if not batches.is_dir():
        archive = data.prepare_archive("synthetic", root, synthetic={
            "train_size": size, "test_size": 1000})
        data.extract_archive(archive, root)
    return batches


def configs(k: int, batch: int, model: str, seeds: bool) -> list:
    """k runs that differ in lr (and, with ``seeds``, in seed: no shared batch)."""
    sweep = {"lr": [0.01 * (i + 1) for i in range(k)]}
    config = with_defaults({"strategies": ["cpu"], "train": {"epochs": 100, "batch_size": batch,
                                                             "model": model}, "sweep": sweep})
    cfgs = [run.config for run in build_runs(config).values()]
    if seeds:
        cfgs = [type(c).from_dict({**c.to_dict(), "seed": i}) for i, c in enumerate(cfgs)]
    return cfgs


def alone(cfg, data_dir: Path, threads: int):
    run = Segment(cfg, get_strategy("cpu")(cfg, threads),
                  SegmentOrder(spec="", data=str(data_dir), out="/nonexistent"))
    run.strategy.setup()
    run.build()
    return PlainStep(run).train_step, run.batches


def timed(step, batches, steps: int, rounds: int) -> float:
    """Median seconds of one step (batches gathered inside the timing, as in training)."""
    it = iter(batches.epoch(0))
    step(*next(it))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(batches.epoch(0))
                x, y = next(it)
            step(x, y)
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)


def profile(step, batches) -> list[dict]:
    x, y = next(iter(batches.epoch(0)))
    step(x, y)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step(x, y)
    rows = [{"op": e.key, "count": e.count, "self_ms": e.self_cpu_time_total / 1000,
             "kernel": e.key not in NO_KERNEL}
            for e in prof.key_averages() if e.key.startswith("aten::")]
    return sorted(rows, key=lambda r: -r["self_ms"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["loop", "vmap"], choices=["loop", "vmap"])
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    data_dir = dataset(args.images)
    quiet = lambda line: None  # noqa: E731
    step, batches = alone(configs(1, args.batch, args.model, False)[0], data_dir, args.threads)
    base = args.batch / timed(step, batches, args.steps, args.rounds)
    cases = [{"case": "one run at a time", "images_per_sec": base, "vs_alone": 1.0}]
    print(f"one run at a time: {base:,.0f} images/s", flush=True)
    profiles = {}
    for mode in args.modes:
        for seeds in (False, True):
            group = fused_group(configs(args.k, args.batch, args.model, seeds), data_dir,
                                args.threads, mode, say=quiet)
            ips = args.k * args.batch / timed(group.train_step, group.batches, args.steps,
                                              args.rounds)
            name = f"fused {mode} K={args.k}, " + ("own batches" if seeds else "shared batch")
            cases.append({"case": name, "images_per_sec": ips, "vs_alone": ips / base})
            print(f"{name}: {ips:,.0f} images/s ({ips / base:.2f}x)", flush=True)
            if not seeds:
                profiles[mode] = profile(group.train_step, group.batches)
    single = profile(step, batches)
    result = {"args": vars(args), "cpu": torch.backends.cpu.get_cpu_capability(),
              "cases": cases, "profiles": {**profiles, "alone": single}}
    (OUT / "fused_cpu.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Fused on CPU: {args.model}, batch {args.batch}, {args.threads} threads, "
             f"median of {args.rounds} x {args.steps} steps", "",
             "| case | images/s | vs one at a time |", "| --- | ---: | ---: |"]
    lines += [f"| {c['case']} | {c['images_per_sec']:,.0f} | {c['vs_alone']:.2f}x |" for c in cases]
    for name, rows in result["profiles"].items():
        kernels = sum(r["count"] for r in rows if r["kernel"])
        lines += ["", f"## One step by operator: {name}" + ("" if name == "alone" else
                                                             f", K = {args.k}"),
                  f"{sum(r['count'] for r in rows)} aten operators, {kernels} that compute",
                  "", "| operator | calls | self ms |", "| --- | ---: | ---: |"]
        lines += [f"| {r['op']} | {r['count']} | {r['self_ms']:.2f} |" for r in rows[:15]]
    (OUT / "fused_cpu.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT / 'fused_cpu.md'}")


if __name__ == "__main__":
    main()
