"""`cifarflow compare A B`: run by run, the final weights' digests of two results folders:
identical, different, missing, or on one side only; exit 0 only when every common run is
identical."""

import csv
import subprocess

from conftest import ENV, PY
from cifarflow.results.compare import compare, describe


def results(folder, digests: dict):
    folder.mkdir()
    with open(folder / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["run", "test_acc", "weights_sha256"])
        writer.writeheader()
        writer.writerows({"run": run, "test_acc": 0.5, "weights_sha256": d}
                         for run, d in digests.items())
    return folder


def run_compare(a, b):
    return subprocess.run([PY, "-m", "cifarflow", "compare", str(a), str(b)], env=ENV,
                          capture_output=True, text=True)


def test_runs_are_identical_differ_lack_a_digest_or_exist_on_one_side(tmp_path):
    a = results(tmp_path / "a", {"cpu": "1" * 64, "ddp": "2" * 64, "old": "", "a_only": "3" * 64})
    b = results(tmp_path / "b", {"cpu": "1" * 64, "ddp": "4" * 64, "old": "5" * 64,
                                 "b_only": "6" * 64})
    c = compare(a, b)
    assert {run: v for run, (v, _, _) in c.verdicts.items()} == {
        "cpu": "identical", "ddp": "differs", "old": "no digest"}
    assert (c.only_a, c.only_b, c.all_match) == (["a_only"], ["b_only"], False)
    lines = describe(c, a, b).splitlines()
    assert lines[3].split() == ["cpu", "identical", "1" * 16]
    assert lines[4].split() == ["ddp", "differs", "A", "2" * 16, "B", "4" * 16]
    assert lines[6].split() == ["a_only", "only", "in", "A"]
    assert "3 runs in common: 1 identical, 1 differs, 1 no digest; 1 only in A, 1 only in B" \
        in lines
    out = run_compare(a, b)
    assert out.returncode == 1 and "ddp" in out.stdout


def test_all_common_runs_identical_exits_0_and_nothing_in_common_exits_1(tmp_path):
    a = results(tmp_path / "a", {"cpu": "1" * 64, "extra": "2" * 64})
    b = results(tmp_path / "b", {"cpu": "1" * 64})
    out = run_compare(a, b / "summary.csv")  # a folder or its summary.csv
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 run in common: 1 identical; 1 only in A, 0 only in B" in out.stdout
    other = results(tmp_path / "c", {"gpu": "1" * 64})
    out = run_compare(a, other)
    assert out.returncode == 1 and "nothing was compared" in out.stdout
    missing = run_compare(a, tmp_path / "nowhere")
    assert missing.returncode == 2 and "no " in missing.stderr and "run the workflow" in missing.stderr
