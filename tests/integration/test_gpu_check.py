"""bench/gpu_check.py, the GPU proof in one command, proven on CPU before a GPU sees it: a
case cut off at its limit ends with every process it started; a check whose budget runs out
still writes its report and leaves nothing behind; `--cpu-smoke --budget 120` names every
case of the GPU run, runs those CPU can within the budget, and finds pytest in the bundle;
the bundle alone is enough to run pytest."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ENV, PY, ROOT

sys.path.insert(0, str(ROOT / "bench"))

from gpu_bounded import group_members, run_bounded  # noqa: E402
from gpu_cases import all_cases, gpu_tests_case  # noqa: E402


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace") \
                    and alive(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


def test_a_case_cut_off_at_its_limit_ends_its_whole_group(tmp_path):
    """The case's leader starts a grandchild that ignores SIGTERM (a trainer busy saving):
    at the limit both end, the grandchild by SIGKILL after the grace, and nothing of the
    group is left."""
    script = ("import os, signal, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
              f"open({str(tmp_path / 'child')!r}, 'w').write(str(child.pid))\n"
              "time.sleep(600)\n")
    t0 = time.monotonic()
    row = run_bounded([PY, "-c", script], tmp_path / "case.log", dict(os.environ), 2.0, ROOT)
    assert row["rc"] == "timeout"
    assert time.monotonic() - t0 < 2.0 + 5.0 + 4  # limit + grace + the kill
    child = int((tmp_path / "child").read_text())
    assert not alive(child) and group_members(row["pgid"]) == []


def test_processes_a_finished_case_leaves_behind_are_ended(tmp_path):
    """A leader that exits 0 while a process it started runs on: the stray is killed and
    counted."""
    script = ("import subprocess, sys\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n")
    row = run_bounded([PY, "-c", script], tmp_path / "case.log", dict(os.environ), 30, ROOT)
    assert row["rc"] == 0 and row["strays_killed"] == 1
    assert group_members(row["pgid"]) == []


def test_pytest_outcomes_skips_fail_the_gpu_run_and_cut_off_runs_say_how_far():
    read = gpu_tests_case(Path("/nonexistent"), "pytest").read
    log = ("collected 3 items\n"
           "tests/gpu/test_gpu.py::test_a PASSED\n"
           "tests/gpu/test_gpu.py::test_nvml SKIPPED (needs nvidia-ml-py (NVML))\n"
           "tests/gpu/test_gpu.py::test_c PASSED\n")
    gpu, smoke = {}, {}
    read(gpu, log, False)
    read(smoke, log, True)
    assert "test_nvml skipped (needs nvidia-ml-py (NVML))" in gpu["error"]
    assert smoke["result"] == "ok (2 passed, 1 skipped)" and "error" not in smoke
    cut = {}
    read(cut, log.rsplit("tests/", 1)[0], True)
    assert cut["error"].startswith("2 of 3 tests reached")


def test_a_check_whose_budget_runs_out_writes_its_report_and_leaves_nothing(tmp_path):
    """A budget too short for the first case: it is cut off, the cases after it are not
    started, the report names each, the check ends within its budget and no process of
    it is left."""
    budget = 30  # the check's start and the data, then a few seconds for the first case
    t0 = time.monotonic()  # each case first sleeps 60 s: the first outlasts the budget
    out = subprocess.run([PY, "bench/gpu_check.py", "--cpu-smoke", "--budget", str(budget),
                          "--stages", "figures", "--out", str(tmp_path)], cwd=ROOT,
                         env={**ENV, "CIFARFLOW_GPU_CHECK_HOLD_S": "60"},
                         capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert wall < budget + 3, wall
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = {r["case"]: r for r in report["rows"]}
    first = rows["lenet alone"]
    assert first["result"].startswith("FAILED: cut off at"), first
    assert group_members(first["pgid"]) == []
    assert processes_naming(str(tmp_path)) == []  # gpu_sweep's trainer too
    assert rows["lenet fused:16"]["result"].startswith("FAILED: not run: budget spent")
    assert rows["resnet18 alone"]["result"].startswith("CPU: not run")
    assert "| lenet alone | FAILED: cut off at" in (tmp_path / "gpu_check.md").read_text()
    # the data before the first case (outside its cap); the goals on standard output
    assert out.stdout.index("data: every case's data set built") < out.stdout.index("--- figures")
    assert out.stdout.count("| goal | target | measured | case | verdict |") == 2


def test_the_plan_fits_the_budget_with_room_on_any_machine(tmp_path):
    """--plan, without torch: every case of the GPU run in its order (the figures, the GPU
    tests, the strategies), each cap at least 1.5x its estimate, the caps within 80 % of
    the budget; a budget they do not fit says so and exits 1."""
    from gpu_cases import CAP_FACTOR

    env = {**ENV, "PYTHONPATH": ""}
    out = subprocess.run([sys.executable, "-S", "bench/gpu_check.py", "--plan", "--budget",
                          "480"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    cases = all_cases(False, 1, tmp_path, ["figures", "tests", "strategies"], "pytest")
    assert [c.stage for c in cases] == sorted(
        (c.stage for c in cases), key=["figures", "tests", "strategies"].index)
    for c in cases:
        assert c.cap_s >= CAP_FACTOR * c.estimate_s
        assert f"| {c.stage} | {c.name} | {c.estimate_s:.1f} | {c.cap_s:.0f} |" in out.stdout
    assert sum(c.cap_s for c in cases) <= 0.8 * 480
    assert out.stdout.rstrip().splitlines()[-2].endswith("fits")
    tight = subprocess.run([PY, "bench/gpu_check.py", "--plan", "--budget", "300"], cwd=ROOT,
                           env=ENV, capture_output=True, text=True, timeout=60)
    assert tight.returncode == 1 and "DOES NOT FIT" in tight.stdout


def test_an_mps_case_that_cannot_start_fails_in_seconds_saying_why(tmp_path):
    """No nvidia-cuda-mps-control: named at once; a control daemon that never answers: named
    after the probe's timeout, not the case's cap."""
    from gpu_bounded import mps_problem

    empty, sleep = tmp_path / "empty", shutil.which("sleep")
    empty.mkdir()
    os.environ["PATH"], saved = str(empty), os.environ["PATH"]
    try:
        assert "nvidia-cuda-mps-control not found" in mps_problem()
        hang = empty / "nvidia-cuda-mps-control"
        hang.write_text(f"#!/bin/sh\nexec {sleep} 60\n")
        hang.chmod(0o755)
        t0 = time.monotonic()
        said = mps_problem(timeout_s=1.0)
    finally:
        os.environ["PATH"] = saved
    assert "control daemon (nvidia-cuda-mps-control -d) did not answer within 1 s" in said
    assert time.monotonic() - t0 < 5


def test_the_bundle_alone_runs_pytest(tmp_path):
    """A bundle of this venv's installed copies (no network): with no site-packages at all
    (python -S), pytest and what it imports come from the bundle."""
    bundle = tmp_path / "bundle"
    subprocess.run([PY, "bench/gpu_bundle.py", "--from-installed", "--dest", str(bundle)],
                   cwd=ROOT, check=True, capture_output=True, timeout=120)
    made = json.loads((bundle / "bundle.json").read_text())["distributions"]
    assert {"pytest", "pluggy", "iniconfig", "packaging", "nvidia-ml-py"} <= set(made)
    code = (f"import sys; sys.path.insert(0, {str(bundle / 'site')!r}); import pytest, pynvml; "
            "print(pytest.__file__); sys.exit(pytest.main(['--version']))")
    ran = subprocess.run([PY, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.startswith(str(bundle / "site"))


@pytest.mark.slow  # the whole check on CPU, ~100 s on a quiet 2-core box
def test_cpu_smoke_names_every_gpu_case_and_runs_within_its_budget(tmp_path):
    """The smoke's budget is room for a loaded machine (4x a quiet 2-core box's time): in the
    smoke each case may use what is left of it, so a tight one would cut cases wherever the
    box is busy. The check cut off at its budget: the test above."""
    budget = 400
    bundle = tmp_path / "bundle"
    subprocess.run([PY, "bench/gpu_bundle.py", "--from-installed", "--dest", str(bundle)],
                   cwd=ROOT, check=True, capture_output=True, timeout=120)
    t0 = time.monotonic()
    out = subprocess.run([PY, "bench/gpu_check.py", "--cpu-smoke", "--budget", str(budget),
                          "--out", str(tmp_path / "out"), "--bundle", str(bundle)], cwd=ROOT,
                         env=ENV, capture_output=True, text=True, timeout=budget + 120)
    wall = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert wall < budget + 3, wall
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["smoke"] and report["pytest"].startswith(str(bundle / "site"))
    gpu_run = [c.name for c in all_cases(False, 1, tmp_path, ["figures", "tests", "strategies"],
                                         "pytest")]
    rows = {r["case"]: r for r in report["rows"]}
    assert list(rows) == gpu_run  # every case of the GPU run, in its order
    assert any("mps" in name for name in rows) and any("resnet18" in name for name in rows)
    for name in ("resnet18 alone", "resnet18 fused:8", "lenet mps:4",
                 "gpu lenet compile+bf16"):
        assert rows[name]["result"].startswith("CPU: not run"), rows[name]
    for row in rows.values():  # a case with a CPU stand-in ran it, and it passed
        assert row["result"].startswith("ok" if row.get("ran") else "CPU: not run"), row
    ran = [r for r in rows.values() if r["result"].startswith("ok")]
    assert {r["stage"] for r in ran} == {"figures", "strategies", "tests"}
    assert all(r["images_per_sec"] > 0 for r in ran if r["stage"] != "tests")
    step = rows["step deterministic: engine vs hand-written"]
    assert step["switches"]["deterministic_algorithms"] is True
    assert step["switches"]["fill_uninitialized_memory"] is False  # as the engine sets it
    assert rows["lenet fused:16"]["ran"] == "fused:2"
    # 3 steps an epoch: figures, but no ratio of them, and why
    assert "vs_alone" not in rows["lenet fused:16"] and "vs_hand_written" not in step
    assert step["ratio_not_shown"].startswith("3 steps an epoch (< 20)")
    assert "CPU smoke: no ratios" in out.stdout
    markdown = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "| engine step / hand-written loop, deterministic | >= 0.95x |" in markdown
    assert "not applicable (CPU smoke)" in markdown


def test_the_report_holds_each_figure_to_its_goal(tmp_path):
    """A GPU run's rows: the best fused lenet pack against the device's goal, resnet18
    fused against alone, the step per mode; a goal no case measured says unmeasured."""
    from gpu_report import Report

    report = Report(tmp_path, {"device": "1 x NVIDIA H100 80GB HBM3", "torch": "2.x",
                               "smoke": False, "budget_s": 480}, ["tensorboard: curves"])
    rows = [("lenet alone", "lenet", "alone", 200_000), ("lenet fused:16", "lenet", "fused",
                                                        1_200_000),
            ("lenet fused-own:64", "lenet", "fused", 1_700_000),
            ("resnet18 alone", "resnet18", "alone", 20_000),
            ("resnet18 fused:8", "resnet18", "fused", 50_000)]
    for case, model, kind, ips in rows:
        report.add({"stage": "figures", "case": case, "model": model, "kind": kind,
                    "images_per_sec": ips, "result": "ok", "wall_s": 1.0})
    report.add({"stage": "figures", "case": "step deterministic", "step_mode": "deterministic",
                "images_per_sec": 210_000, "vs_hand_written": 0.97, "result": "ok",
                "wall_s": 1.0})
    lenet, resnet, deterministic, nondeterministic = json.loads(
        (tmp_path / "gpu_check.json").read_text())["goals"]
    assert (lenet["measured"], lenet["case"], lenet["verdict"]) == (
        1_700_000, "lenet fused-own:64", "met")  # >= 1,600,000 on an H100
    assert (resnet["measured"], resnet["verdict"]) == (2.5, "missed")
    assert (deterministic["measured"], deterministic["verdict"]) == (0.97, "met")
    assert nondeterministic["verdict"] == "unmeasured"  # no case measured it
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "| lenet fused:16 | ok | 1,200,000 | 6.0x |" in markdown
    assert "- tensorboard: curves" in markdown


def test_runs_side_by_side_are_counted_over_the_union_of_their_windows(tmp_path):
    """Two MPS replicas of 1,000 images an epoch at 1,000 images/s each, the second started
    when the first had finished: 1,000 images/s over the union (not the 2,000 their rates
    add up to) and no time in which both trained; fully overlapped: 2,000 and 1.0."""
    from gpu_sweep import side_by_side
    from cifarflow.layout import RunPaths

    def write(results, run, starts):
        folder = Path(RunPaths(str(results), run).segment(1))
        folder.mkdir(parents=True)
        rows = [{"images_per_sec": 1000.0, "images_per_sec_per_rank": 1000.0, "wall_s": 1.0,
                 "started_at": t, "ended_at": t + 1.0} for t in starts]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    apart, together = tmp_path / "apart", tmp_path / "together"
    write(apart, "a", [0.0, 1.0, 2.0])  # epoch 1 (warm-up) is not counted
    write(apart, "b", [3.0, 4.0, 5.0])
    write(together, "a", [0.0, 1.0, 2.0])
    write(together, "b", [0.0, 1.0, 2.0])
    assert side_by_side(apart, ["a", "b"]) == {"images_per_sec": 1000.0, "union_s": 4.0,
                                               "overlap": 0.0}
    assert side_by_side(together, ["a", "b"]) == {"images_per_sec": 2000.0, "union_s": 2.0,
                                                  "overlap": 1.0}
