"""bench/gpu_check.py, the GPU proof in one command, proven on CPU before a GPU sees it:
`--cpu-smoke` runs every stage end to end with tiny sizes (the gpu tests, which skip
without CUDA; the strategies through their launchers; the step and sweep figures), and
leaves its JSON and markdown with a row per case."""

import json
import subprocess

import pytest

from conftest import ENV, PY, ROOT


@pytest.mark.slow  # every stage at tiny sizes: about 3 minutes on this CPU
def test_gpu_check_runs_end_to_end_on_cpu():
    out = subprocess.run([PY, "bench/gpu_check.py", "--cpu-smoke"], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((ROOT / "bench/out/gpu_check/gpu_check.json").read_text())
    assert report["smoke"] is True
    stages = {(row["stage"], row["case"]): row for row in report["rows"]}
    assert {stage for stage, _ in stages} == {"tests", "strategies", "step", "sweep"}
    assert all(row["rc"] == 0 for row in report["rows"]), report["rows"]
    assert {case for stage, case in stages if stage == "strategies"} == {
        "cpu lenet", "ddp lenet x2 gloo", "lightning lenet"}
    assert all(row["images_per_sec"] > 0 for row in report["rows"]
               if row["stage"] == "strategies")
    sweep = json.loads((ROOT / "bench/out/gpu_sweep.json").read_text())
    assert [f["case"] for f in sweep["figures"]] == ["alone", "fused:2", "fused-own:2"]
    assert all(f["images_per_sec"] > 0 for f in sweep["figures"])
    markdown = (ROOT / "bench/out/gpu_check/gpu_check.md").read_text()
    assert "| sweep | sweep of small models | ok |" in markdown
    assert "fused-own:2" in markdown  # the sweep's own table, appended
    assert "| engine | deterministic |" in markdown  # the step's figures
