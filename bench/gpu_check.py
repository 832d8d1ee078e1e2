"""The GPU proof in one command, sized for a short GPU job: `--budget` seconds (480: a
10-minute test job less its start), spent in the order of what matters, from a copy of the
repository on a machine with torch + CUDA and pyyaml (no snakemake, no package index).

    make gpu-check                                   # python3 bench/gpu_check.py --budget 480
    python3 bench/gpu_check.py --plan --budget 480   # each case's estimate and cap (any machine)
    python3 bench/gpu_check.py --budget 300 --out /scratch/me/gpu_check
    python3 bench/gpu_check.py --cpu-smoke --budget 120   # every case named, those CPU can run

Stages, in this order (bench/gpu_cases.py lists the cases):

  figures     the goal figures: lenet fused K = 16 and 64 (shared and own batches) against
              one at a time, resnet18 fused against alone (bench/gpu_sweep.py), the engine's
              step against a hand-written loop in both modes (bench/gpu_step.py); then MPS
  tests       pytest -m gpu tests/gpu: the CUDA paths no CPU test reaches
  strategies  the strategies no figure runs, through the real cli and its launcher

The data sets are built once, before the first case. Each case's cap is 1.5x its estimated
cost on an H100 (gpu_cases.py's cost model; bench/README.md), and the caps add up to 80 % of
--budget at most (--plan shows it). Each case runs in a process group of its own, bounded by
its cap and what is left of the budget; at its limit the whole group ends, with a bounded
wait after every kill (bench/gpu_bounded.py), so nothing of it trains on into the next case;
a case the budget no longer fits is reported as not run, one that cannot start (MPS absent or
not answering within 10 s) fails at once saying why. The goals table is printed on standard
output when the figures stage ends, and again at the end. After every
case gpu_check.json and gpu_check.md are rewritten in --out (bench/out), the goals beside the
figures. A failed, cut-off or unrun case, and a skipped gpu test (a missing dependency: its
reason is in the report), fail the check, except that --cpu-smoke accepts skips and marks the
cases it cannot run on CPU. pytest and the other pure-Python wheels come from
bench/gpu_bundle (`make gpu-bundle` where an index is reachable; bench/gpu_bundle.py).
"""

from __future__ import annotations

import time

STARTED = time.monotonic()  # the budget counts from here: torch's import is part of it

import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT / "scripts")]

import gpu_bundle  # noqa: E402
from gpu_bounded import Budget, gpu_use, run_bounded  # noqa: E402
from gpu_cases import Case, all_cases  # noqa: E402
from gpu_report import Report  # noqa: E402

MIN_CASE_S = 2  # a case given less than this is not started
HOLD_ENV = "CIFARFLOW_GPU_CHECK_HOLD_S"  # tests only: each case sleeps this long first


def missing_tools(smoke: bool, pytest_found: str | None) -> list[str]:
    """What this machine lacks, and what could not be measured without it."""
    import importlib.util

    missing = []
    if not pytest_found:
        missing.append("pytest: the gpu tests (make gpu-bundle where a package index is "
                       "reachable, and bring bench/gpu_bundle with the repository)")
    if smoke:
        return missing
    if not importlib.util.find_spec("pynvml"):
        missing.append("nvidia-ml-py (NVML): GPU utilisation in the runs' metrics and the "
                       "NVML test (make gpu-bundle brings it)")
    if not importlib.util.find_spec("tensorboard"):
        missing.append("tensorboard: the runs' curves (the figures do not need them)")
    if not importlib.util.find_spec("lightning"):
        missing.append("lightning: the lightning strategy and its test")
    if not shutil.which("nvidia-smi"):
        missing.append("nvidia-smi: GPU utilisation while each case runs")
    if not shutil.which("nvidia-cuda-mps-control"):
        missing.append("nvidia-cuda-mps-control: the MPS-shared cases and the MPS test")
    return missing


PLAN_SHARE = 0.8  # the caps' sum against the budget: the rest is starts, reports, slack


def plan(cases: list[Case], budget: float) -> tuple[str, bool]:
    """The table of every case with its estimate and cap, and the sum against the budget;
    and whether the caps fit PLAN_SHARE of it."""
    rows = ["| stage | case | estimate on an H100 (s) | cap (s) | arithmetic |",
            "| --- | --- | ---: | ---: | --- |"]
    rows += [f"| {c.stage} | {c.name} | {c.estimate_s:.1f} | {c.cap_s:.0f} | {c.estimate[1]} |"
             for c in cases]
    estimate, caps = sum(c.estimate_s for c in cases), sum(c.cap_s for c in cases)
    fits = caps <= PLAN_SHARE * budget
    rows += ["", f"{len(cases)} cases: estimates {estimate:.0f} s, caps {caps:.0f} s = "
             f"{100 * caps / budget:.0f} % of the {budget:.0f} s budget (at most "
             f"{100 * PLAN_SHARE:.0f} %: {PLAN_SHARE * budget:.0f} s): "
             + ("fits" if fits else "DOES NOT FIT"),
             "The data sets are built before the first case, outside the caps, inside the "
             "rest of the budget (with the Python start and the reports)."]
    return "\n".join(rows), fits


def build_data(cases: list[Case]) -> float:
    """Every data set the cases read, built once (synthetic, CIFAR format) before the first
    case, outside their caps; seconds it took."""
    from cifarflow import data as cdata

    t0 = time.monotonic()
    for root, images, test_images in dict.fromkeys(d for c in cases if c.argv for d in c.data):
        if (root / "cifar-10-batches-py").is_dir():
            continue
        making = root.with_name(root.name + ".making")  # a check cut off leaves no half of it
        shutil.rmtree(making, ignore_errors=True)
        archive = cdata.prepare_archive("synthetic", making, synthetic={
            "train_size": images, "test_size": test_images})
        cdata.extract_archive(archive, making)
        making.rename(root)
    return time.monotonic() - t0


def run_case(case: Case, report: Report, budget: Budget, env: dict, out: Path,
             smoke: bool) -> bool:
    """One case, bounded; its row (figures, or why it failed or did not run) into the
    report. True when it failed."""
    row = {"stage": case.stage, "case": case.name, **case.tags}
    if case.argv is None:
        report.add({**row, "result": f"CPU: not run: {case.why_not}", "wall_s": 0.0})
        return False
    if case.missing:
        report.add({**row, "result": f"FAILED: not run: {case.missing}", "wall_s": 0.0})
        return True
    cap = budget.seconds if smoke else case.cap_s  # the caps are a GPU's; CPU takes longer
    if budget.limit(cap) < MIN_CASE_S:
        report.add({**row, "result": f"FAILED: not run: budget spent ({budget.left():.0f} s "
                    "left)", "wall_s": 0.0})
        return True
    row["ran"] = case.ran
    problem = None if smoke or not case.precheck else case.precheck()
    if problem:
        report.add({**row, "result": f"FAILED: cannot start: {problem}", "wall_s": 0.0})
        return True
    try:
        argv = [str(a) for a in case.argv()]  # a strategy's planning and data: budget time
    except Exception as exc:  # noqa: BLE001  (its plan refused, its data not made)
        report.add({**row, "result": f"FAILED: not started: {type(exc).__name__}: {exc}",
                    "wall_s": 0.0})
        return True
    hold = os.environ.get(HOLD_ENV)  # tests: a case that outlasts any budget, on any machine
    if hold:
        argv = ["sh", "-c", f'sleep {float(hold)}; exec "$@"', "sh", *argv]
    limit = max(0.1, budget.limit(cap))
    log = out / "logs" / f"{case.stage}-{case.slug}.log"
    # the case's own TMPDIR, short (an MPS daemon's pipes go there: a socket path has 108
    # characters at most), removed after it
    tmp = tempfile.mkdtemp(prefix="gpu_check-")
    print(f"--- {case.stage}: {case.name} (limit {limit:.0f} s): {' '.join(argv)}", flush=True)
    sampler = None if smoke else gpu_use()
    outcome = run_bounded(argv, log, {**env, "TMPDIR": tmp}, limit, ROOT)
    shutil.rmtree(tmp, ignore_errors=True)
    row.update(outcome)
    if sampler:
        row.update(sampler.stop(case.gpus))
    text = log.read_text(errors="replace")
    try:
        case.read(row, text, smoke)  # its figures, or why they are missing
    except Exception as exc:  # noqa: BLE001  (a case's outputs absent or malformed)
        row.setdefault("error", f"{type(exc).__name__}: {exc}")
    if outcome["rc"] == "stuck":
        row["result"] = (f"FAILED: its process outlived SIGKILL (stuck in the driver?): "
                         f"{outcome.get('stuck_after_kill')}")
    elif outcome["rc"] == "timeout":
        row["result"] = f"FAILED: cut off at {limit:.0f} s"
    elif outcome["rc"] != 0:
        row["error"] = text[-1500:]
        last = (text.strip() or "no output").splitlines()[-1][:300]
        row["result"] = f"FAILED (rc {outcome['rc']}): {last}"
    elif row.get("error"):
        row["result"] = f"FAILED: {row['error'].strip().splitlines()[-1][:300]}"
    else:
        row.setdefault("result", "ok")
    report.add(row)
    return not row["result"].startswith("ok")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=480, help="seconds for the whole check")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out",
                    help="where gpu_check.json and gpu_check.md (and logs/, runs) go")
    ap.add_argument("--cpu-smoke", action="store_true", help="the same check on CPU, tiny: "
                    "every case named, those CPU cannot run marked")
    ap.add_argument("--bundle", type=Path, default=gpu_bundle.DEFAULT,
                    help="the pure-Python wheels the check brings (make gpu-bundle)")
    ap.add_argument("--stages", nargs="+", default=["figures", "tests", "strategies"],
                    choices=["figures", "tests", "strategies"])
    ap.add_argument("--plan", action="store_true", help="print every case with its estimate "
                    "and cap and their sum against --budget, and exit (any machine)")
    a = ap.parse_args()
    if a.plan:
        table, fits = plan(all_cases(False, 1, a.out.resolve(), a.stages, "pytest"), a.budget)
        print(table)
        sys.exit(0 if fits else 1)
    budget = Budget(a.budget, STARTED)
    site = gpu_bundle.activate(a.bundle)

    import torch

    smoke = a.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible here (torch.cuda.is_available() is False); run "
              "it on a GPU node, or --cpu-smoke", file=sys.stderr)
        sys.exit(2)
    gpus = 0 if smoke else torch.cuda.device_count()
    device = "cpu (smoke)" if smoke else f"{gpus} x {torch.cuda.get_device_name(0)}"
    pytest_found = gpu_bundle.where("pytest")
    out = a.out.resolve()
    for old in ("gpu_check.json", "gpu_check.md"):
        (out / old).unlink(missing_ok=True)
    shutil.rmtree(out / "logs", ignore_errors=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "1000",
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the machine's plugins, not the bundle's
           "PYTHONPATH": os.pathsep.join(filter(None, [str(site or ""), str(ROOT / "scripts"),
                                                       str(ROOT / "tests"),
                                                       os.environ.get("PYTHONPATH", "")]))}
    header = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
              "smoke": smoke, "budget_s": a.budget, "bundle": str(site) if site else None,
              "pytest": pytest_found}
    report = Report(out, header, missing_tools(smoke, pytest_found))
    print(f"{device}, torch {torch.__version__}, CUDA {torch.version.cuda}, budget "
          f"{a.budget:.0f} s, pytest from {pytest_found}", flush=True)
    cases = all_cases(smoke, gpus, out, a.stages, pytest_found)
    took = build_data(cases)
    print(f"data: every case's data set built in {took:.1f} s", flush=True)
    failed = 0
    for i, case in enumerate(cases):
        failed += run_case(case, report, budget, env, out, smoke)
        if case.stage == "figures" and (i + 1 == len(cases) or cases[i + 1].stage != "figures"):
            print("\n" + report.goals_text() + "\n", flush=True)  # before anything can cut it off
    report.write()
    if "figures" in a.stages:
        print("\n" + report.goals_text(), flush=True)
    print(f"\nwrote {out / 'gpu_check.md'}: {len(report.rows)} case(s), {failed} failed, "
          f"{time.monotonic() - STARTED:.0f} s of {a.budget:.0f}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
