"""The GPU proof in one command, sized for a short GPU job: `--budget` seconds (480: a
10-minute test job less its start), spent in the order of what matters, from a copy of the
repository on a machine with torch + CUDA and pyyaml (no snakemake, no package index).

    make gpu-check                                   # python3 bench/gpu_check.py --budget 480
    python3 bench/gpu_check.py --budget 300 --out /scratch/me/gpu_check
    python3 bench/gpu_check.py --cpu-smoke --budget 120   # every case named, those CPU can run

Stages, in this order (bench/gpu_cases.py lists the cases):

  figures     the goal figures: lenet fused K = 16/32/64 (shared and own batches) against one
              at a time, resnet18 fused against alone (bench/gpu_sweep.py), the engine's step
              against a hand-written loop in both modes (bench/gpu_step.py); then MPS-shared
  strategies  every strategy through the real cli and its launcher: img/s, GPU utilisation
  tests       pytest -m gpu tests/gpu: the CUDA paths no CPU test reaches

Each case runs in a process group of its own, bounded by its cap and what is left of the
budget; at its limit the whole group ends (bench/gpu_bounded.py), so nothing of it trains on
into the next case; a case the budget no longer fits is reported as not run. After every
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
    if budget.limit(case.cap_s) < MIN_CASE_S:
        report.add({**row, "result": f"FAILED: not run: budget spent ({budget.left():.0f} s "
                    "left)", "wall_s": 0.0})
        return True
    row["ran"] = case.ran
    try:
        argv = [str(a) for a in case.argv()]  # a strategy's planning and data: budget time
    except Exception as exc:  # noqa: BLE001  (its plan refused, its data not made)
        report.add({**row, "result": f"FAILED: not started: {type(exc).__name__}: {exc}",
                    "wall_s": 0.0})
        return True
    hold = os.environ.get(HOLD_ENV)  # tests: a case that outlasts any budget, on any machine
    if hold:
        argv = ["sh", "-c", f'sleep {float(hold)}; exec "$@"', "sh", *argv]
    limit = max(0.1, budget.limit(case.cap_s))
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
    if outcome["rc"] == "timeout":
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
    ap.add_argument("--stages", nargs="+", default=["figures", "strategies", "tests"],
                    choices=["figures", "strategies", "tests"])
    a = ap.parse_args()
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
    failed = 0
    for case in all_cases(smoke, gpus, out, a.stages, pytest_found):
        failed += run_case(case, report, budget, env, out, smoke)
    report.write()
    print(f"\nwrote {out / 'gpu_check.md'}: {len(report.rows)} case(s), {failed} failed, "
          f"{time.monotonic() - STARTED:.0f} s of {a.budget:.0f}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
