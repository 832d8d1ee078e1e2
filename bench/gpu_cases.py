"""The cases of bench/gpu_check.py, in the order the budget is spent on them, each with its
command, its cap on a GPU, how its figures are read, and its CPU stand-in (--cpu-smoke: a
tiny run of the same command, or why CPU cannot run it)."""

from __future__ import annotations

import json
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


@dataclass
class Case:
    stage: str
    name: str                     # as the GPU run names it
    cap_s: float                  # its own limit (the budget may leave it less)
    argv: Callable[[], list] | None  # built when it starts; None: not run on this device
    read: Callable[[dict, str, bool], None] = lambda row, log, smoke: None
    ran: str = ""                 # what runs (the CPU stand-in's own name in the smoke)
    why_not: str = ""
    missing: str = ""             # a dependency it needs and this machine lacks
    gpus: int = 1                 # GPUs its utilisation is averaged over
    tags: dict = field(default_factory=dict)  # model, kind, step_mode: the report's keys

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name)


# ---- figures: bench/gpu_sweep.py and bench/gpu_step.py, one case per process ------------
def sweep_case(name: str, case: str, cap_s: float, out: Path, smoke: bool, images: int,
               cpu_case: str | None = None, why_not: str = "") -> Case:
    model, _, how = case.rpartition("/")
    kind = how.split(":")[0].split("-")[0]  # alone | fused | mps
    folder = out / "figures"
    run_as = (cpu_case if smoke else case)
    sizes = (["--small", "--images", 600, "--epochs", 2, "--alone-runs", 1, "--threads", 2]
             if smoke else ["--images", images, "--epochs", 3, "--alone-runs", 2])

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

    runnable = not smoke or cpu_case
    return Case("figures", name, cap_s, argv if runnable else None, read, ran=run_as or "",
                why_not=why_not, tags={"model": model or "lenet", "kind": kind})


def step_case(mode: str, cap_s: float, out: Path, smoke: bool) -> Case:
    folder = out / "figures"
    sizes = (["--small", "--images", 600, "--epochs", 2, "--reps", 1, "--threads", 2]
             if smoke else ["--reps", 2])

    def argv() -> list:
        (folder / "gpu_step.json").unlink(missing_ok=True)
        return [PY, BENCH / "gpu_step.py", "--modes", mode, "--no-ddp", "--out", folder, *sizes]

    def read(row: dict, log: str, smoke: bool) -> None:
        result = json.loads((folder / "gpu_step.json").read_text())
        by_case = {s["case"]: s for s in result["summary"] if s["mode"] == mode}
        engine, hand = by_case["engine"], by_case["hand-written"]
        row.update(images_per_sec=engine["images_per_sec"],
                   hand_written_images_per_sec=hand["images_per_sec"],
                   vs_hand_written=engine["vs_hand_written"],
                   switches=next(r["switches"] for r in result["runs"]
                                 if r["case"] == "hand-written" and "switches" in r))

    return Case("figures", f"step {mode}: engine vs hand-written", cap_s, argv, read,
                ran=f"gpu_step.py --modes {mode}", tags={"step_mode": mode})


def figure_cases(out: Path, smoke: bool) -> list[Case]:
    lenet, resnet = 50_000, 10_000  # images: lenet's epoch is short, resnet18's is not
    cases = [sweep_case("lenet alone", "alone", 60, out, smoke, lenet, "alone")]
    for k in (16, 32, 64):
        for kind in ("fused", "fused-own"):
            stand_in = f"{kind}:2" if k == 16 else None
            cases.append(sweep_case(f"lenet {kind}:{k}", f"{kind}:{k}", 30 + k, out, smoke,
                                    lenet, stand_in, f"{kind}:2, the stand-in of {kind}:16, "
                                    f"runs this command on CPU; {k} members cost only time"))
    cases += [sweep_case("resnet18 alone", "resnet18/alone", 60, out, smoke, resnet,
                         why_not=RESNET18_ON_CPU),
              sweep_case("resnet18 fused:8", "resnet18/fused:8", 120, out, smoke, resnet,
                         why_not=RESNET18_ON_CPU),
              step_case("deterministic", 90, out, smoke),
              step_case("nondeterministic", 90, out, smoke)]
    cases += [sweep_case(f"lenet mps:{m}", f"mps:{m}", 60, out, smoke, lenet, why_not=NEEDS_MPS)
              for m in (4, 8)]
    return cases


# ---- strategies: each through the real cli and its launcher ------------------------------
STRATEGIES = [  # name, strategy, train settings, the CPU stand-in (name, strategy, settings)
    ("gpu lenet", "gpu", {"model": "lenet"}, ("cpu lenet", "cpu", {"model": "lenet"})),
    ("gpu resnet18", "gpu", {"model": "resnet18"}, RESNET18_ON_CPU),
    ("gpu resnet18 compile+bf16", "gpu", {"model": "resnet18", "compile": True, "amp": "bf16"},
     RESNET18_ON_CPU),
    ("ddp resnet18", "ddp", {"model": "resnet18"}, ("ddp lenet x2 gloo", "ddp", {"model": "lenet"})),
    ("fsdp resnet18", "fsdp", {"model": "resnet18"}, RESNET18_ON_CPU + " (fsdp on gloo: "
     "tests/integration/test_distributed.py)"),
    ("mps lenet x4", "mps", {"model": "lenet"}, NEEDS_MPS),
    ("lightning resnet18", "lightning", {"model": "resnet18"},
     ("lightning lenet", "lightning", {"model": "lenet"})),
]


def strategy_case(name: str, strategy: str, settings: dict, stand_in, out: Path, smoke: bool,
                  gpus: int) -> Case:
    if smoke and isinstance(stand_in, str):
        return Case("strategies", name, 0, None, why_not=stand_in, tags={"strategy": strategy})
    if smoke:
        name_run, strategy, settings = stand_in
    else:
        name_run = name
    world = 2 if smoke else max(1, gpus)
    folder = out / "strategies" / re.sub(r"[^A-Za-z0-9_.-]+", "-", name_run)
    images, epochs = (600, 1) if smoke else (20_000, 2)

    def argv() -> list:
        from cifarflow import data as cdata
        from cifarflow.config import with_defaults
        from cifarflow.controller.plan import build_runs

        synthetic = {"train_size": images, "test_size": 400 if smoke else 2000}
        root = out / "strategies" / f"data-{images}"
        batches = root / "cifar-10-batches-py"
        if not batches.is_dir():
            cdata.extract_archive(cdata.prepare_archive("synthetic", root, synthetic=synthetic),
                                  root)
        config = with_defaults({
            "strategies": [strategy], "data": {"synthetic": synthetic},
            "train": {"epochs": epochs, "batch_size": 512, "lr": 0.05, "log_interval_s": 30,
                      **settings},
            "distributed": {"device": "cpu" if smoke else "cuda", "world_size": world},
            "mps": {"replicas": 4},
            "resources": {"cpus_per_task": max(1, (os.cpu_count() or 2) // 4)}})
        run = build_runs(config)[strategy]
        shutil.rmtree(folder, ignore_errors=True)
        spec = folder / "spec.json"
        run.config.write(spec)
        prefix = run.strategy_class.command_prefix(PY, run).split()
        return [*prefix, PY, "-m", "cifarflow", "train", "--spec", spec, "--data", batches,
                "--out", folder / "run", "--threads", run.resources["cpus_per_task"]]

    def read(row: dict, log: str, smoke: bool) -> None:
        last = json.loads((folder / "run" / "metrics.jsonl").read_text().splitlines()[-1])
        row.update(images_per_sec=last["images_per_sec"], test_acc=last["test_acc"],
                   world_size=last["world_size"])

    return Case("strategies", name, 150, argv, read, ran=name_run,
                gpus=1 if strategy in ("gpu", "mps") else world, tags={"strategy": strategy})


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
    return Case("tests", "pytest -m gpu tests/gpu", 300, argv, read, ran="pytest -m gpu",
                missing=missing)


def all_cases(smoke: bool, gpus: int, out: Path, stages: list[str],
              pytest_found: str | None) -> list[Case]:
    cases = []
    if "figures" in stages:
        cases += figure_cases(out, smoke)
    if "strategies" in stages:
        cases += [strategy_case(*s, out, smoke, gpus) for s in STRATEGIES]
    if "tests" in stages:
        cases.append(gpu_tests_case(out, pytest_found))
    return cases
