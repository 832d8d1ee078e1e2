"""`cifarflow show` on a summary written here: whatever verdicts the measured speeds give a
run, its row shows the first one, cut to the terminal's width; advice.md's tips about no one
run follow the table."""

import csv

from cifarflow.results.show import show

SUMMARY = [
    {"run": "slow_one", "strategy": "cpu", "test_acc": 0.61, "images_per_sec": 900.0,
     "wall_s": 75.0, "status": "ok", "data_source": "download",
     "data_md5": "c58f30108f718f92721af3b95e74349a", "advice": ""},
    {"run": "fast_one", "strategy": "cpu", "test_acc": 0.52, "images_per_sec": 12000.0,
     "wall_s": 3.2, "status": "ok", "data_source": "synthetic", "data_md5": "",
     "advice": "1 -> 2 cpus gives only x1.49: adding cores stops "
     "paying there | fastest run: fast_one at 12,000 images/s"}]
ADVICE = """# Advice

- fastest run: fast_one at 12,000 images/s
- fast_one: 1 -> 2 cpus gives only x1.49: adding cores stops paying there
- cpu (2 run(s)): used at most 700 MB of 2,000 MB requested: request resources.mem_mb ~1,000
"""


def test_each_row_shows_its_first_verdict_and_the_general_tips_follow(tmp_path):
    with open(tmp_path / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(SUMMARY[0]))
        writer.writeheader()
        writer.writerows(SUMMARY)
    (tmp_path / "advice.md").write_text(ADVICE)
    lines = show(tmp_path, width=200).splitlines()
    assert lines[0] == "2 runs: 2 ok"
    assert lines[2].split() == ["run", "strategy", "test_acc", "images/s", "wall", "status",
                                "data", "advice"]
    # each run's data: its source and the start of the tarball's md5
    assert lines[3].split() == ["slow_one", "cpu", "0.610", "900", "1m15s", "ok", "download",
                                "c58f3010"]
    assert lines[4].split()[:7] == ["fast_one", "cpu", "0.520", "12,000", "3.2s", "ok",
                                    "synthetic"]
    column = lines[2].index("advice")
    assert lines[4][column:] == "1 -> 2 cpus gives only x1.49: adding cores stops paying there"
    assert lines[6] == ("- cpu (2 run(s)): used at most 700 MB of 2,000 MB requested: request "
                        "resources.mem_mb ~1,000")
    assert not any(line.startswith("- fastest run") for line in lines)  # in its run's row
    narrow = show(tmp_path, width=109).splitlines()  # 74 for the columns, 35 for the verdict
    assert narrow[4][column:] == "1 -> 2 cpus gives only x1.49: addi…"
    assert len(narrow[4]) == 109
    narrowest = show(tmp_path, width=80).splitlines()  # the verdict keeps 24 characters
    assert narrowest[4][column:] == "1 -> 2 cpus gives only …"


def test_show_digest_adds_each_runs_weights_sha256(tmp_path):
    digests = {"slow_one": "ab" * 32, "fast_one": ""}  # fast_one: published before digests
    with open(tmp_path / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(SUMMARY[0]) + ["weights_sha256"])
        writer.writeheader()
        writer.writerows({**row, "weights_sha256": digests[row["run"]]} for row in SUMMARY)
    lines = show(tmp_path, width=300, digest=True).splitlines()
    assert lines[2].split()[-2:] == ["weights_sha256", "advice"]
    assert lines[3].split()[-1] == "ab" * 32
    assert lines[4].split()[6] == "synthetic" and "ab" * 32 not in lines[4]
    assert "weights_sha256" not in show(tmp_path, width=300)


def test_runs_trained_in_slurm_jobs_on_synthetic_data_are_warned_about(tmp_path):
    """summary.csv's data_source says synthetic and slurm_job_ids says Slurm ran it: show
    says so in a WARNING line above the table (a local demo run is not warned about)."""
    jobs = {"slow_one": "41 42", "fast_one": "43"}
    with open(tmp_path / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(SUMMARY[0]) + ["slurm_job_ids"])
        writer.writeheader()
        writer.writerows({**row, "slurm_job_ids": jobs[row["run"]]} for row in SUMMARY)
    lines = show(tmp_path, width=200).splitlines()
    assert lines[1].startswith("WARNING: 1 run(s) trained in Slurm jobs on synthetic data "
                               "(data.source synthetic")
    assert "fast_one" in lines[1] and lines[2] == ""
    assert lines[4].split()[0] == "slow_one" and lines[5].split()[6] == "synthetic"
    jobs["fast_one"] = ""  # trained here, as the demo does
    with open(tmp_path / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(SUMMARY[0]) + ["slurm_job_ids"])
        writer.writeheader()
        writer.writerows({**row, "slurm_job_ids": jobs[row["run"]]} for row in SUMMARY)
    assert "WARNING" not in show(tmp_path, width=200)
