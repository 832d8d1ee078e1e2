"""The cases of bench/gpu_check.py, in the order the budget is spent on them, each with its
command, its estimated cost on an H100 (the cost model below; bench/README.md shows the
arithmetic), its cap (1.5x that estimate), how its figures are read, and its CPU stand-in
(--cpu-smoke: a tiny run of the same command, or why CPU cannot run it)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
RESNET18_ON_CPU = "resnet18 trains at 12-70 images/s on CPU: beyond the smoke's budget"
NEEDS_MPS = "MPS needs a CUDA GPU and nvidia-cuda-mps-control"


# ---- the cost model: every cap is CAP_FACTOR x its case's estimate on an H100 ----------
CAP_FACTOR = 1.5
START_S = 4.0     # a training process to its first batch: 3 s measured here (README, "Fixed
                  # cost of one segment"), + 1 s for the CUDA context
WRAPPER_S = 2.5   # a bench script or pytest to its first case: `import torch` (2.1-2.5 s here)
H100 = 0.7        # an H100's share of an H200's rate: HBM3 3.35 TB/s against HBM3e 4.8 TB/s
RATE = {          # images/s trained on an H100: the H200 figures the README records x H100
    "lenet": 131_000 * H100,            # `gpu`, deterministic (before issue 26's fixes)
    "lenet nondeterministic": 200_000 * H100,
    "lenet fused": 1_007_000 * H100,    # the vmap probe of stacked LeNets, K = 8
    "lenet mps": 282_000 * H100,        # `mps`, 4 replicas
    "resnet18": 8_000,                  # computed, not measured: ~1.7 GFLOP a trained image
                                        # at ~14 TFLOP/s (a fifth of the H100's FP32 peak)
    "resnet18 fused": 12_000,           # 1.5x alone (the goal is 3x; 1x still fits the cap)
}
EVAL_SPEED = 3.0  # evaluation (forward only) runs at 3x the training rate


def cost(starts: int = 0, wrappers: int = 0, work: float = 0.0, **images) -> tuple[float, str]:
    """(estimated seconds, the arithmetic): ``starts`` training processes, ``wrappers``
    bench scripts, ``work`` seconds of fixed work (compiles, daemons), and images trained
    (``<rate key with _ for spaces>=n``; eval_<key>=n for evaluated images)."""
    total = starts * START_S + wrappers * WRAPPER_S + work
    parts = ([f"{wrappers} x {WRAPPER_S:g}"] if wrappers else []) + \
        ([f"{starts} x {START_S:g}"] if starts else []) + ([f"{work:.1f}"] if work else [])
    for key, n in images.items():
        evaluated = key.startswith("eval_")
        rate = RATE[key.removeprefix("eval_").replace("_", " ")] * (EVAL_SPEED if evaluated else 1)
        total += n / rate
        parts.append(f"{n:,} {'eval ' if evaluated else ''}img / {rate:,.0f}/s")
    return round(total, 1), " + ".join(parts)


@dataclass
class Case:
    stage: str
    name: str                     # as the GPU run names it
    estimate: tuple[float, str]   # (seconds on an H100, the arithmetic): cost(...)
    argv: Callable[[], list] | None  # built when it starts; None: not run on this device
    read: Callable[[dict, str, bool], None] = lambda row, log, smoke: None
    ran: str = ""                 # what runs (the CPU stand-in's own name in the smoke)
    why_not: str = ""
    missing: str = ""             # a dependency it needs and this machine lacks
    gpus: int = 1                 # GPUs its utilisation is averaged over
    tags: dict = field(default_factory=dict)  # model, kind, step_mode: the report's keys
    precheck: Callable[[], str | None] | None = None  # why it cannot start (seconds), or None
    data: list = field(default_factory=list)  # (folder, train images, test images) it reads

    @property
    def estimate_s(self) -> float:
        return self.estimate[0]

    @property
    def cap_s(self) -> float:
        """Its own limit on a GPU (the budget may leave it less)."""
        return float(math.ceil(CAP_FACTOR * self.estimate_s))

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name)


# ---- figures: bench/gpu_sweep.py and bench/gpu_step.py, one case per process ------------
def sweep_data(out: Path, images: int) -> tuple:
    """The data set bench/gpu_sweep.py reads for ``images`` under ``out`` (its dataset())."""
    return (out / "figures" / "gpu_sweep" / f"data-{images}", images, max(1000, images // 5))


def sweep_case(name: str, case: str, estimate: tuple, out: Path, smoke: bool, images: int,
               cpu_case: str | None = None, why_not: str = "", precheck=None) -> Case:
    model, _, how = case.rpartition("/")
    kind = how.split(":")[0].split("-")[0]  # alone | fused | mps
    folder = out / "figures"
    run_as = (cpu_case if smoke else case)
    images = 600 if smoke else images
    sizes = (["--small", "--images", images, "--epochs", 2, "--alone-runs", 1, "--threads", 2]
             if smoke else ["--images", images, "--epochs", 3, "--alone-runs", 1])

    def argv() -> list:
        (folder / "gpu_sweep.json").unlink(missing_ok=True)  # never the last case's figures
        return [PY, BENCH / "gpu_sweep.py", "--cases", run_as, "--out", folder, *sizes]

    def read(row: dict, log: str, smoke: bool) -> None:
        figure = json.loads((folder / "gpu_sweep.json").read_text())["figures"][0]
        if "error" in figure:
            row["error"] = figure["error"]
        else:
            row.update(images_per_sec=figure["images_per_sec"],
                       runs_at_once=figure["runs_at_once"])
            for key in ("union_s", "overlap"):
                if key in figure:
                    row[key] = figure[key]

    runnable = not smoke or cpu_case
    return Case("figures", name, estimate, argv if runnable else None, read, ran=run_as or "",
                why_not=why_not, tags={"model": model or "lenet", "kind": kind},
                precheck=precheck, data=[sweep_data(out, images)])


def step_case(mode: str, out: Path, smoke: bool) -> Case:
    folder = out / "figures"
    images, epochs = (600, 2) if smoke else (50_000, 4)
    sizes = (["--small", "--images", images, "--epochs", epochs, "--reps", 1, "--threads", 2]
             if smoke else ["--images", images, "--epochs", epochs, "--reps", 1])
    key = "lenet" if mode == "deterministic" else "lenet_nondeterministic"
    estimate = cost(wrappers=1, starts=2, **{key: 2 * images * epochs},
                    eval_lenet=2 * (images // 5) * epochs)

    def argv() -> list:
        (folder / "gpu_step.json").unlink(missing_ok=True)
        return [PY, BENCH / "gpu_step.py", "--modes", mode, "--no-ddp", "--out", folder, *sizes]

    def read(row: dict, log: str, smoke: bool) -> None:
        result = json.loads((folder / "gpu_step.json").read_text())
        by_case = {s["case"]: s for s in result["summary"] if s["mode"] == mode}
        engine, hand = by_case["engine"], by_case["hand-written"]
        row.update(images_per_sec=engine["images_per_sec"],
                   hand_written_images_per_sec=hand["images_per_sec"],
                   switches=next(r["switches"] for r in result["runs"]
                                 if r["case"] == "hand-written" and "switches" in r))
        if "vs_hand_written" in engine:
            row["vs_hand_written"] = engine["vs_hand_written"]
        else:  # too few steps to compare (gpu_step.py says why)
            row["ratio_not_shown"] = result.get("no_ratio", "")

    return Case("figures", f"step {mode}: engine vs hand-written", estimate, argv, read,
                ran=f"gpu_step.py --modes {mode}", tags={"step_mode": mode},
                data=[sweep_data(out, images)])


FUSED_MEMBER_IMAGES = 800_000  # lenet fused:K trains K x images = this an epoch, any K
RESNET18_IMAGES = 4096         # 32 batches of 128


def figure_cases(out: Path, smoke: bool) -> list[Case]:
    from gpu_bounded import mps_problem

    lenet = 50_000
    cases = [sweep_case("lenet alone", "alone",
                        cost(wrappers=1, starts=1, lenet=3 * lenet, eval_lenet=3 * lenet // 5),
                        out, smoke, lenet, "alone")]
    for k, kind in ((16, "fused"), (16, "fused-own"), (64, "fused"), (64, "fused-own")):
        images = FUSED_MEMBER_IMAGES // k
        own = {"work": 0.2 * 3 * FUSED_MEMBER_IMAGES / RATE["lenet fused"]} if "own" in kind \
            else {}  # own batches: a gather per member, taken as 20 % more
        estimate = cost(wrappers=1, starts=1, lenet_fused=3 * FUSED_MEMBER_IMAGES,
                        eval_lenet_fused=3 * k * max(1000, images // 5), **own)
        stand_in = f"{kind}:2" if k == 16 else None
        cases.append(sweep_case(f"lenet {kind}:{k}", f"{kind}:{k}", estimate, out, smoke,
                                images, stand_in, f"{kind}:2, the stand-in of {kind}:16, runs "
                                f"this command on CPU; {k} members cost only time"))
    r = RESNET18_IMAGES
    cases += [sweep_case("resnet18 alone", "resnet18/alone",
                         cost(wrappers=1, starts=1, resnet18=3 * r, eval_resnet18=3 * 1000),
                         out, smoke, r, why_not=RESNET18_ON_CPU),
              sweep_case("resnet18 fused:8", "resnet18/fused:8",
                         cost(wrappers=1, starts=1, resnet18_fused=8 * 3 * r,
                              eval_resnet18_fused=8 * 3 * 1000),
                         out, smoke, r, why_not=RESNET18_ON_CPU),
              step_case("deterministic", out, smoke),
              step_case("nondeterministic", out, smoke),
              # 4 clients start at once on the node's cores: 1.5 starts; 1 s for the daemon
              sweep_case("lenet mps:4", "mps:4",
                         cost(wrappers=1, work=1.5 * START_S + 1.0, lenet_mps=4 * 3 * lenet,
                              eval_lenet_mps=4 * 3 * lenet // 5),
                         out, smoke, lenet, why_not=NEEDS_MPS, precheck=mps_problem)]
    return cases


# ---- strategies: each through the real cli and its launcher ------------------------------
# `gpu` on lenet and resnet18 and `mps` are the figures' own commands (the step's engine
# case, resnet18 alone, lenet mps:4), and tests/gpu runs each strategy's CUDA path
# (nccl for ddp and fsdp, lightning on the GPU, mps-run): this stage measures the rest.
COMPILE_S = 11.0  # lenet's two cold Inductor graphs (training, evaluation) on a GPU node:
                  # estimated (42 s for one on this 2-core CPU, README), not measured
STRATEGY_IMAGES, STRATEGY_TEST_IMAGES = 5120, 2048  # 10 batches of 512, 2 of 1,024
STRATEGIES = [  # name, strategy, train settings, cost, the CPU stand-in (name, strategy, settings)
    ("gpu lenet compile+bf16", "gpu", {"model": "lenet", "compile": True, "amp": "bf16"},
     cost(starts=1, work=COMPILE_S, lenet=STRATEGY_IMAGES, eval_lenet=STRATEGY_TEST_IMAGES),
     "compile on CPU: 42 s for lenet's "
     "first graph on this 2-core box, beyond the smoke's budget"),
    ("ddp resnet18", "ddp", {"model": "resnet18"},
     cost(wrappers=1, starts=1, resnet18=STRATEGY_IMAGES, eval_resnet18=STRATEGY_TEST_IMAGES),
     ("ddp lenet x2 gloo", "ddp", {"model": "lenet"})),
    ("fsdp resnet18", "fsdp", {"model": "resnet18"},
     cost(wrappers=1, starts=1, resnet18=STRATEGY_IMAGES, eval_resnet18=STRATEGY_TEST_IMAGES),
     RESNET18_ON_CPU + " (fsdp on gloo: tests/integration/test_distributed.py)"),
    ("lightning resnet18", "lightning", {"model": "resnet18"},
     cost(wrappers=1, starts=1, resnet18=STRATEGY_IMAGES, eval_resnet18=STRATEGY_TEST_IMAGES),
     ("lightning lenet", "lightning", {"model": "lenet"})),  # wrapper: lightning's import
]


def strategy_data(out: Path, smoke: bool) -> tuple:
    images = 600 if smoke else STRATEGY_IMAGES
    return (out / "strategies" / f"data-{images}", images, 400 if smoke else STRATEGY_TEST_IMAGES)


def strategy_case(name: str, strategy: str, settings: dict, estimate: tuple, stand_in,
                  out: Path, smoke: bool, gpus: int) -> Case:
    if smoke and isinstance(stand_in, str):
        return Case("strategies", name, estimate, None, why_not=stand_in,
                    tags={"strategy": strategy})
    if smoke:
        name_run, strategy, settings = stand_in
    else:
        name_run = name
    world = 2 if smoke else max(1, gpus)
    folder = out / "strategies" / re.sub(r"[^A-Za-z0-9_.-]+", "-", name_run)
    root, images, test_images = strategy_data(out, smoke)

    def argv() -> list:
        from cifarflow.config import with_defaults
        from cifarflow.controller.plan import build_runs

        synthetic = {"train_size": images, "test_size": test_images}
        config = with_defaults({
            "strategies": [strategy], "data": {"synthetic": synthetic},
            "train": {"epochs": 1, "batch_size": 512, "eval_batch_size": 1024, "lr": 0.05,
                      "log_interval_s": 30, **settings},
            "distributed": {"device": "cpu" if smoke else "cuda", "world_size": world},
            "resources": {"cpus_per_task": max(1, (os.cpu_count() or 2) // 4)}})
        run = build_runs(config)[strategy]
        shutil.rmtree(folder, ignore_errors=True)
        spec = folder / "spec.json"
        run.config.write(spec)
        prefix = run.strategy_class.command_prefix(PY, run).split()
        return [*prefix, PY, "-m", "cifarflow", "train", "--spec", spec, "--data",
                root / "cifar-10-batches-py", "--out", folder / "run", "--threads",
                run.resources["cpus_per_task"]]

    def read(row: dict, log: str, smoke: bool) -> None:
        last = json.loads((folder / "run" / "metrics.jsonl").read_text().splitlines()[-1])
        row.update(images_per_sec=last["images_per_sec"], test_acc=last["test_acc"],
                   world_size=last["world_size"])

    return Case("strategies", name, estimate, argv, read, ran=name_run,
                gpus=1 if strategy in ("gpu", "mps") else world, tags={"strategy": strategy},
                data=[(root, images, test_images)])


# ---- tests: pytest -m gpu tests/gpu ------------------------------------------------------
OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \((.*)\))?\s*$")


def outcomes_of(log: str) -> list[dict]:
    """Each reported test of a `pytest -v` log (console_output_style classic, wide columns),
    as far as it got."""
    found = {}
    for line in log.splitlines():
        m = OUTCOME.match(line.rstrip())
        if m:
            found[m[1]] = {"test": m[1].split("::")[-1], "outcome": m[2],
                           "reason": (m[3] or "").strip()}
    return list(found.values())


def gpu_tests_case(out: Path, pytest_found: str | None) -> Case:
    def argv() -> list:
        return [PY, "-m", "pytest", "-v", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider",
                "-o", "console_output_style=classic"]

    def read(row: dict, log: str, smoke: bool) -> None:
        tests = outcomes_of(log)
        collected = re.search(r"collected (\d+) item", log)
        total = int(collected[1]) if collected else None
        counts = {}
        for t in tests:
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        said = ", ".join(f"{n} {o.lower()}" for o, n in counts.items())
        row.update(tests=tests, tests_collected=total)
        bad = [t for t in tests if t["outcome"] in ("FAILED", "ERROR")
               or (t["outcome"] == "SKIPPED" and not smoke)]
        if total is not None and len(tests) < total:
            row["error"] = f"{len(tests)} of {total} tests reached ({said})"
        elif bad:
            row["error"] = f"{said}: " + "; ".join(
                f"{t['test']} {t['outcome'].lower()}" + (f" ({t['reason']})" if t["reason"] else "")
                for t in bad)
        elif not tests:
            row["error"] = "no test ran"
        else:
            row["result"] = f"ok ({said})"

    missing = "" if pytest_found else "pytest (make gpu-bundle; see the report's missing list)"
    return Case("tests", "pytest -m gpu tests/gpu", TESTS_COST, argv, read,
                ran="pytest -m gpu", missing=missing)


# tests/gpu: 16 processes that train (3 segments, 3 fused segments, ddp and fsdp through
# their launcher at 3 each, lightning, mps-run and its 2 members), pytest's own start, and
# 15 s of work in pytest's process (2,000-image runs, the fused group, NVML's sampling)
TESTS_COST = cost(starts=16, wrappers=1, work=15.0)


def all_cases(smoke: bool, gpus: int, out: Path, stages: list[str],
              pytest_found: str | None) -> list[Case]:
    """Every case of ``stages``, in the order they run: the goal figures, the GPU tests,
    the strategies (the order of ``stages`` does not matter)."""
    cases = []
    if "figures" in stages:
        cases += figure_cases(out, smoke)
    if "tests" in stages:
        cases.append(gpu_tests_case(out, pytest_found))
    if "strategies" in stages:
        cases += [strategy_case(*s, out, smoke, gpus) for s in STRATEGIES]
    return cases
