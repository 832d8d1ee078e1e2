"""The workflow through real snakemake runs: plan, local run, sweep, report, config
errors, and a SIGKILLed segment resumed on rerun."""

import csv
import json
import os
import re
import signal
import subprocess
import time
from html.parser import HTMLParser
from importlib.metadata import version
from pathlib import Path

import pytest

from conftest import (ENV, PY, ROOT, assert_bit_identical, cli, metrics_of, probe_wheel,
                      self_stopped, snakemake, state_of, stop_at, summary_rows, weights_digest)
from cifarflow.engine.checkpoints import files as ckpt

CONFIGS = ROOT / "tests" / "configs"


def job_counts(stdout: str) -> dict:
    counts, table = {}, False
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:2] == ["job", "count"]:
            table = True
        elif table and len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
        elif table and counts and not parts:
            break
    return counts


def read_summary(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_dry_run_lists_the_chain(tmp_path):
    out = snakemake(tmp_path, "-n", configfile=CONFIGS / "local" / "config.yaml")
    counts = job_counts(out.stdout)
    assert counts == {"fetch_dataset": 1, "extract_dataset": 1, "record_environment": 1,
                      "train_cpu": 2, "aggregate_results": 1, "all": 1, "total": 7}
    spec = tmp_path / "results/runs/cpu/spec.json"  # the plan, written where it is made
    stamp = spec.stat().st_mtime_ns
    snakemake(tmp_path, "-n", configfile=CONFIGS / "local" / "config.yaml")
    assert spec.stat().st_mtime_ns == stamp  # unchanged config: the file is not rewritten
    assert "results/runs/cpu/segment-1" in out.stdout and "results/runs/cpu/segment-2" in out.stdout


def test_plan_of_six_strategies_four_values_ten_segments(tmp_path):
    t0 = time.perf_counter()
    out = snakemake(tmp_path, "-n", configfile=CONFIGS / "plan" / "config.yaml")
    elapsed = time.perf_counter() - t0
    counts = job_counts(out.stdout)
    for strategy in ("cpu", "gpu", "ddp", "mps", "lightning", "fsdp"):
        assert counts[f"train_{strategy}"] == 4 * 10
    assert len(list((tmp_path / "results/runs").glob("*/spec.json"))) == 6 * 4
    assert counts["total"] == 6 * 4 * 10 + 5
    print(f"\nplanning 245 jobs took {elapsed:.2f} s (bench/plan_prune.py measures planning)")


def test_partial_summary_of_a_thousand_run_sweep(tmp_path):
    """The run descriptions reach aggregation as a file: 1000 runs (1 MB of JSON) passed
    as one argument fail with 'Argument list too long' (Linux caps one at 128 KiB)."""
    config = tmp_path / "sweep.yaml"
    lrs = [round(1e-4 * (k + 1), 6) for k in range(1000)]
    config.write_text(f"strategies: [cpu]\nsweep: {{lr: {lrs}}}\n")
    snakemake(tmp_path, "--cores", "1", "summarize_partial", configfile=config)
    rows = read_summary(tmp_path / "results/partial/summary.csv")
    assert len(rows) == 1000 and {r["status"] for r in rows} == {"missing"}
    runs = json.loads((tmp_path / "results/partial/runs.json").read_text())
    assert len(runs) == 1000 and runs["cpu_lr0p1"]["spec"]["lr"] == 0.1


def finished_run(tmp_path_factory, case: str) -> Path:
    """A real local run of tests/configs/<case>, in its own working directory."""
    work = tmp_path_factory.mktemp(case)
    out = snakemake(work, "--cores", 2, configfile=CONFIGS / case / "config.yaml")
    (work / "snakemake.out").write_text(out.stdout + out.stderr)
    return work


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    return finished_run(tmp_path_factory, "local")


def test_local_run_learns_and_summarises(local_run):
    rows = read_summary(local_run / "results" / "summary.csv")
    assert len(rows) == 1
    row = rows[0]
    for col in ("run", "strategy", "model", "batch_size", "world_size", "epochs",
                "images_per_sec", "train_loss", "test_acc", "wall_s"):
        assert row[col] != "", col
    assert row["strategy"] == "cpu" and row["status"] == "ok" and int(row["epochs"]) == 3
    assert float(row["test_acc"]) > 0.3 and float(row["images_per_sec"]) > 0
    history = [json.loads(l) for l in
               (local_run / "results/runs/cpu/segment-2/metrics.jsonl").read_text().splitlines()]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert int(row["segments"]) == 2
    log = (local_run / "results/logs/train/cpu/segment-2.log").read_text()
    assert "resumed from results/runs/cpu/segment-1 at epoch 3" in log
    env = json.loads((local_run / "results/environment/environment.json").read_text())
    import torch

    assert env["torch"] == torch.__version__  # the job's torch is this venv's
    assert env["cuda_available"] is torch.cuda.is_available()
    assert "torch==" in (local_run / "results/environment/pip-freeze.txt").read_text()
    plots = sorted((local_run / "results/plots").glob("*.png"))
    assert [p.name for p in plots] == ["curves.png", "throughput_accuracy.png"]  # one run
    for png in plots:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert (local_run / "results/benchmarks/train/cpu/segment-1.tsv").is_file()


def test_tensorboard_of_a_workflow_run_reads_back_as_one_curve(local_run):
    """The run's TensorBoard directory, read back as TensorBoard reads it: one file per
    segment, and each epoch's scalars at its step with the values of metrics.jsonl."""
    from test_tensorboard import assert_epoch_scalars, event_files

    board = local_run / "results/tensorboard/cpu"
    assert len(event_files(board)) == 2  # 2 segments
    assert_epoch_scalars(board, metrics_of(local_run / "results/runs/cpu/segment-2"), 2000 // 100)


def test_rerun_is_a_no_op(local_run):
    out = snakemake(local_run, "-n", configfile=CONFIGS / "local" / "config.yaml")
    assert "Nothing to be done" in out.stdout + out.stderr


@pytest.mark.parametrize("override, message", [
    (["strategies=[cpu,tpu]"], "unknown strategy 'tpu'; known: cpu, ddp, fsdp, gpu, lightning, mps"),
    (["train={'batch_size': -4}"], "Error validating config file"),
    (["train={'epochs': 'many'}"], "Error validating config file"),
    (["sweep={'colour': [1, 2]}"], "Error validating config file"),
    (["distributed={'backend': 'nccl', 'device': 'cpu'}", "strategies=[ddp]"],
     "backend nccl needs device cuda"),
    (["train={'model': 'no_such_pkg.nets:make'}"], "cannot import no_such_pkg.nets"),
])
def test_invalid_config_fails_before_anything_runs(tmp_path, override, message):
    out = snakemake(tmp_path, "-n", configfile=ROOT / "config" / "config.yaml", config=override,
                    check=False)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert message in text
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("prune, message", [
    ("{keep: 1, at_segments: [1]}", "sweep.prune.keep 1 must be between 0 and 1"),
    ("{keep: 0.5, at_segments: [2]}", "sweep.prune.at_segments [2]: a pruning point"),
    ("{metric: accuracy, at_segments: [1]}", "sweep.prune.metric 'accuracy' unknown"),
])
def test_invalid_prune_settings_fail_in_the_dry_run_with_one_line(tmp_path, prune, message):
    cfg = tmp_path / "prune.yaml"
    cfg.write_text(f"segments: {{count: 2}}\nsweep: {{lr: [0.1, 0.01], prune: {prune}}}\n")
    out = snakemake(tmp_path, "-n", configfile=[ROOT / "config" / "config.yaml", cfg],
                    check=False)
    assert out.returncode != 0
    lines = [l for l in (out.stdout + out.stderr).splitlines() if message in l]
    assert lines and lines[0].startswith("config error: "), out.stderr[-2000:]


@pytest.mark.slow
def test_a_new_strategy_is_one_new_file(tmp_path, local_run):
    """A copy of the project with one module added to strategies/ (the cpu strategy under
    another name) plans, trains and summarises it, with nothing else edited."""
    import shutil

    project = tmp_path / "project"
    for part in ("workflow", "scripts", "config"):
        shutil.copytree(ROOT / part, project / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "Snakefile", project / "Snakefile")
    (project / "scripts/cifarflow/engine/strategies/cpu_copy.py").write_text(
        (ROOT / "scripts/cifarflow/engine/strategies/cpu.py").read_text()
        .replace('name = "cpu"', 'name = "cpu_copy"').replace("CPUStrategy", "CPUCopyStrategy"))
    work = tmp_path / "work"
    cmd = [str(Path(PY).parent / "snakemake"), "-s", str(project / "Snakefile"), "--directory",
           str(work), "--configfile", str(CONFIGS / "local" / "config.yaml"), "--config",
           "strategies=[cpu_copy]"]
    plan = subprocess.run([*cmd, "-n"], env=ENV, capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert job_counts(plan.stdout)["train_cpu_copy"] == 2
    run = subprocess.run([*cmd, "--cores", "2"], env=ENV, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_summary(work / "results/summary.csv")
    assert [(r["run"], r["strategy"], r["status"]) for r in rows] == [("cpu_copy", "cpu_copy", "ok")]
    # same training as the cpu strategy: the same weights, bit for bit
    assert_bit_identical(state_of(local_run / "results/runs/cpu/segment-2")["model"],
                         state_of(work / "results/runs/cpu_copy/segment-2")["model"])


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    return finished_run(tmp_path_factory, "sweep")


@pytest.mark.slow
def test_sweep_yields_one_row_per_combination(sweep_run):
    rows = read_summary(sweep_run / "results" / "summary.csv")
    assert sorted(r["run"] for r in rows) == ["cpu_bs100_cpus1", "cpu_bs100_cpus2",
                                            "cpu_bs200_cpus1", "cpu_bs200_cpus2"]
    for r in rows:
        assert r["batch_size"] == r["sweep_batch_size"]
        assert r["cpus_per_task"] == r["sweep_cpus_per_task"]
        assert float(r["test_acc"]) > 0.2 and float(r["images_per_sec"]) > 100
    plots = {p.name: p.stat().st_size for p in (sweep_run / "results/plots").glob("*.png")}
    assert {"throughput_accuracy.png", "curves.png", "sweep_throughput.png"} <= set(plots)
    assert all(size > 5000 for size in plots.values())
    advice = (sweep_run / "results/advice.md").read_text()
    assert "best throughput per core" in advice


@pytest.mark.slow
def test_sweep_prints_its_progress(sweep_run):
    """progress_s: 1 (the test config): lines of the plan's runs and segments, while it
    trained, counts that only grow, the time left once a segment finished."""
    printed = (sweep_run / "snakemake.out").read_text()
    found = [(int(runs), int(segments), left) for runs, segments, left in re.findall(
        r"progress: (\d) of 4 runs done, (\d) of 4 segments(; about \S+ left)?", printed)]
    assert found, printed[-3000:]
    assert found == sorted(found) and all(runs <= segments for runs, segments, _ in found)
    assert all(left for runs, segments, left in found if 0 < segments < 4)


@pytest.mark.slow
def test_make_run_ends_with_the_results_at_a_glance(sweep_run, tmp_path):
    """The Makefile's `run` recipe, as make runs it (with this venv's commands), on a real
    sweep's results: the table, best test accuracy first, and where everything else is."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()  # newer than the requirements: make installs nothing
    recipe = subprocess.run(["make", "-n", "-C", str(ROOT), "run", f"VENV={venv}"],
                            capture_output=True, text=True, check=True).stdout
    show = [line for line in recipe.splitlines() if "cifarflow show" in line]
    assert len(show) == 1, recipe
    command = show[0].replace(f"{venv}/bin/", f"{Path(PY).parent}/")
    out = subprocess.run(command, shell=True, cwd=sweep_run, env={**ENV, "COLUMNS": "150"},
                         capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    rows = read_summary(sweep_run / "results/summary.csv")
    assert lines[0] == "4 runs: 4 ok"
    assert lines[2].split() == ["run", "strategy", "test_acc", "images/s", "wall", "status",
                                "data", "advice"]
    best_first = sorted(rows, key=lambda r: (-float(r["test_acc"]), r["run"]))
    table = [line.split() for line in lines[3:7]]
    assert [t[0] for t in table] == [r["run"] for r in best_first]
    assert [t[2] for t in table] == [f"{float(r['test_acc']):.3f}" for r in best_first]
    assert [t[5] for t in table] == ["ok"] * 4
    assert [t[6] for t in table] == ["synthetic"] * 4  # what each run trained on
    # each row ends with its run's first verdict (which ones a run gets follows the measured
    # speeds: the fastest run may also lead a tip of its own on cores); the fastest run has one
    column = lines[2].index("advice")
    for line, r in zip(lines[3:7], best_first):
        verdict, cell = r["advice"].split(" | ")[0], line[column:]
        assert cell == verdict or (cell.endswith("…") and verdict.startswith(cell[:-1])), line
    fastest = re.search(r"- fastest run: (\S+) at", (sweep_run / "results/advice.md")
                        .read_text()).group(1)
    assert "fastest run" in next(r["advice"] for r in rows if r["run"] == fastest)
    assert all(len(line) <= 150 for line in lines)
    assert f"full table ({len(rows[0])} columns): results/summary.csv" in lines
    assert "advice: results/advice.md" in lines
    assert any(line.startswith("plots:  results/plots/ (") and "curves.png" in line
               for line in lines)
    assert any("snakemake --report results/report.html" in line for line in lines)


def test_show_keeps_a_300_run_sweep_readable(sweep_run, tmp_path, monkeypatch):
    """The sweep's runs.json, as the workflow wrote it, 75 times over (8 runs without
    metrics): the aggregate code's summary.csv, then the 20 most accurate runs, a count of
    the rest and of each status."""
    from cifarflow.results.aggregate import aggregate
    from cifarflow.results.show import show

    monkeypatch.chdir(sweep_run)  # runs.json holds paths relative to the workflow
    runs = json.loads(Path("results/runs.json").read_text())
    big = {f"{name}_r{i:02d}": dict(run, metrics=run["metrics"] if i < 73 else None)
           for i in range(75) for name, run in runs.items()}
    aggregate(big, tmp_path / "big", tmp_path / "big/plots", keep_missing=True)
    text = show(tmp_path / "big", top=20, width=120)
    lines = text.splitlines()
    assert lines[0] == "300 runs: 292 ok, 8 missing; the 20 most accurate:"
    table = [line.split() for line in lines[3:23]]
    accuracies = [float(t[2]) for t in table]
    assert accuracies == sorted(accuracies, reverse=True)
    best = max(float(r["test_acc"]) for r in read_summary(tmp_path / "big/summary.csv")
               if r["test_acc"])
    assert accuracies[0] == round(best, 3)
    assert lines[23] == f"... and 280 more (cifarflow show --top 0 {tmp_path / 'big'}: all)"
    assert all(len(line) <= 120 for line in lines if str(tmp_path) not in line)
    everything = show(tmp_path / "big", top=0, width=120).splitlines()
    missing = [line for line in everything if line.startswith("cpu_") and " missing " in line]
    assert len(missing) == 8 and all("see results/logs/train/" in line for line in missing)


def test_show_without_results_says_how_to_get_them(tmp_path):
    out = subprocess.run([PY, "-m", "cifarflow", "show", str(tmp_path / "results")], env=ENV,
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "summary.csv: run the workflow first (make run" in out.stderr


class VisibleText(HTMLParser):
    """The text a person sees in a rendered DOM: none of <script>, <style>, <noscript>, nor
    of any element (and what it holds) styled display: none."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
            "source", "track", "wbr"}

    def __init__(self):
        super().__init__()
        self.hidden, self.lines = [], []  # per open element: is it (or one above) hidden

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        style = (dict(attrs).get("style") or "").replace(" ", "")
        self.hidden.append(bool(self.hidden and self.hidden[-1]) or
                           tag in ("script", "style", "noscript") or "display:none" in style)

    def handle_endtag(self, tag):
        if tag not in self.VOID and self.hidden:
            self.hidden.pop()

    def handle_data(self, data):
        if data.strip() and not (self.hidden and self.hidden[-1]):
            self.lines.append(" ".join(data.split()))


def chromium_dom(url: str, profile) -> str:
    """The DOM of a page as headless Chromium rendered it (its scripts run)."""
    chromium = next((c for c in ("chromium", "chromium-browser") if
                     subprocess.run(["which", c], capture_output=True).returncode == 0), None)
    assert chromium, "install Debian's chromium (make debian-packages does)"
    browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update",
               "--no-first-run", f"--user-data-dir={profile}",
               "--virtual-time-budget=10000", "--window-size=1280,900"]
    return subprocess.run([*browser, "--dump-dom", url], capture_output=True, text=True,
                          timeout=120).stdout


def test_report_renders_in_chromium(sweep_run, tmp_path):
    """The report, opened in headless Chromium, shows its navigation (the result categories)
    and the workflow's description filled in from the config, and no longer its loading
    screen or its "enable Javascript" notice; the report's embedded data does not count."""
    snakemake(sweep_run, "--report", "results/report.html",
              configfile=CONFIGS / "sweep" / "config.yaml")
    report = sweep_run / "results/report.html"
    assert report.stat().st_size > 10_000
    seen = VisibleText()
    seen.feed(chromium_dom(f"file://{report}", tmp_path / "profile"))
    text = "\n".join(seen.lines)
    assert "Please enable Javascript" not in text and "Loading Snakemake Report" not in text
    lines = seen.lines
    assert lines[lines.index("Results"):][:3] == ["Results", "Plots", "Summary"], lines[:40]
    assert "CIFAR-10 training on Slurm: strategies ['cpu'], model" in text, text[:2000]
    # the page as it was never rendered: its data is there, its entries are not
    unrendered = VisibleText()
    unrendered.feed(report.read_text())
    assert "Please enable Javascript in your browser to see this report." in unrendered.lines
    assert "Plots" not in unrendered.lines and "throughput_accuracy.png" in report.read_text()


@pytest.mark.slow
def test_sigkill_mid_segment_resumes_from_the_last_in_segment_checkpoint(tmp_path):
    cfg = CONFIGS / "kill" / "config.yaml"
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    killed.mkdir()
    cmd = [str(Path(PY).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory",
           str(killed), "--configfile", str(cfg), "--cores", "2"]
    # the training stops itself right after its first in-segment save: killed there, it
    # is mid-segment however fast the machine trains
    marker = tmp_path / "stopped.pid"
    proc = subprocess.Popen(cmd, env={**ENV, **stop_at("save:1", "runs/cpu/segment-1", marker)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    self_stopped(marker, proc)
    saved = ckpt.read_manifest(killed / "results/runs/cpu/work")
    assert not saved["done"]
    os.killpg(proc.pid, signal.SIGKILL)  # the node dies: snakemake and training at once
    proc.wait()
    for manifest in killed.rglob("checkpoint.json"):
        ckpt.read_manifest(manifest.parent)  # every published checkpoint is whole
    assert not (killed / "results/runs/cpu/segment-1/checkpoint.json").exists()
    snakemake(killed, "--unlock", configfile=cfg)  # the killed snakemake left its lock
    snakemake(killed, "--cores", 2, "--rerun-incomplete", configfile=cfg)
    log = (killed / "results/logs/train/cpu/segment-1.log").read_text()
    assert (f"resumed from results/runs/cpu/work at epoch {saved['epoch'] + 1}, batch "
            f"{saved['step']}\n") in log
    snakemake(clean, "--cores", 2, configfile=cfg)
    assert_bit_identical(state_of(clean / "results/runs/cpu/segment-1")["model"],
                         state_of(killed / "results/runs/cpu/segment-1")["model"])
    assert weights_digest(clean / "results/runs/cpu/segment-1") == \
        weights_digest(killed / "results/runs/cpu/segment-1")


@pytest.mark.slow  # a whole workflow run, frozen then let on: about 15 s
def test_second_workflow_in_the_same_directory_is_refused(tmp_path):
    cfg = CONFIGS / "kill" / "config.yaml"
    cmd = [str(Path(PY).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory",
           str(tmp_path), "--configfile", str(cfg), "--cores", "1"]
    marker = tmp_path / "stopped.pid"  # the first run holds its lock while it trains:
    first = subprocess.Popen(  # stopped there from its first batch, it is still running
        cmd, env={**ENV, **stop_at("before-first-batch", "runs/cpu/segment-1", marker)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    training = [self_stopped(marker, first)]
    try:
        second = snakemake(tmp_path, "--cores", 1, configfile=cfg, check=False)
    finally:
        for pid in training:
            os.kill(pid, signal.SIGCONT)
    assert second.returncode != 0 and "cannot be locked" in second.stdout + second.stderr
    assert first.wait(timeout=600) == 0  # the first one is unharmed
    ckpt.read_manifest(tmp_path / "results/runs/cpu/segment-1")


def test_alliance_environment_prologue(tmp_path):
    """env.mode slurm_tmpdir: the job venv installs this venv's own versions of what the
    plan's runs import (written at plan time, a dry run included: a cpu run's, no lightning)
    on every node of the job, after a clean module state, and the prologue hands its build
    time to the training."""
    one_node = tmp_path / "one_node.yaml"
    one_node.write_text("env: {mode: slurm_tmpdir, modules: [python/3.11], check_wheelhouse: false}\n")
    out = snakemake(tmp_path, "-n", "-p", configfile=[CONFIGS / "local" / "config.yaml", one_node])
    train = next(l for l in out.stdout.splitlines() if "cifarflow train" in l)
    assert train.index("module load python/3.11") < train.index("node_venv.sh")
    # SLURM_TMPDIR as the job had it before the jobstep dropped SLURM_* (empty here)
    assert 'JOB_VENV="${CIFARFLOW_SLURM_TMPDIR:-' in train
    derived = tmp_path / "results/environment/job-requirements.txt"
    assert re.search(rf"build_start=\$SECONDS && \S*node_venv.sh {derived} --no-index && "
                     r"export CIFARFLOW_ENV_BUILD_S=\$\(\(SECONDS - build_start\)\) && source",
                     train), train
    pins = derived.read_text()
    for name in ("torch", "torchvision", "numpy", "pyyaml", "tensorboard"):
        assert f"\n{name}=={version(name)}\n" in pins, name  # this venv's, exactly
    assert "snakemake" not in pins and "pandas" not in pins
    assert "lightning" not in pins and "nvidia-ml-py" not in pins  # a cpu run's: none
    # a clean start: module purge, then env.modules, and PYTHONPATH the engine's alone
    assert train.index("then module purge; fi && module load python/3.11 && export "
                       f"PYTHONPATH={ROOT / 'scripts'} && ") < train.index("node_venv.sh")
    # the job's own shell starts the build; node_venv.sh runs it on every node the job holds
    assert "srun" not in train.split("python -m cifarflow train")[0]


def test_a_dry_run_refuses_job_requirements_the_wheelhouse_lacks(tmp_path):
    """The wheelhouse check at `snakemake -n`: pip's resolver, without installing, against
    the jobs' index options; a version the wheelhouse lacks is named with those it has, and
    an accepted plan is not checked again."""
    wheels = probe_wheel(tmp_path / "wheels", version="0.1")
    probe_wheel(wheels, version="0.2")
    requirements = tmp_path / "job-requirements.txt"
    requirements.write_text("cifarflow-probe==0.3\n")
    env_config = (f"env={{'mode': 'slurm_tmpdir', 'requirements': '{requirements}', "
                  f"'find_links': '{wheels}'}}")
    only_the_wheelhouse = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""}
    refused = snakemake(tmp_path, "-n", configfile=CONFIGS / "local" / "config.yaml",
                        config=[env_config], check=False, env=only_the_wheelhouse)
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "cifarflow-probe==0.3 (the wheelhouse has 0.1, 0.2)" in text, text[-3000:]
    assert "No job was queued" in text
    requirements.write_text("cifarflow-probe==0.2\n")
    planned = snakemake(tmp_path, "-n", configfile=CONFIGS / "local" / "config.yaml",
                        config=[env_config], env=only_the_wheelhouse)
    assert "holds every job requirement" in planned.stdout + planned.stderr
    again = snakemake(tmp_path, "-n", configfile=CONFIGS / "local" / "config.yaml",
                      config=[env_config], env=only_the_wheelhouse)
    assert "holds every job requirement" not in again.stdout + again.stderr  # kept


@pytest.mark.slow
def test_a_failed_attempt_is_retried_resumes_and_keeps_its_log(tmp_path):
    """The training process dies mid-segment (OOM killer, node trouble): it stops itself
    right after its first in-segment save (batch 1), so the kill point does not depend on
    the machine's speed; with --retries the next attempt resumes from exactly that save,
    ends bit-identical to an uninterrupted run (its weights_sha256 too), the first
    attempt's log is kept, and summary.csv counts the attempts."""
    often = tmp_path / "often.yaml"  # a save after every batch: the kill lands mid-segment
    often.write_text("train: {epochs: 2, checkpoint_interval_s: 0.001}\n")
    configs = [CONFIGS / "kill" / "config.yaml", often]
    cmd = [str(Path(PY).parent / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory",
           str(tmp_path / "killed"), "--configfile", *map(str, configs), "--cores", "2",
           "--retries", "1"]
    marker = tmp_path / "stopped.pid"
    proc = subprocess.Popen(cmd, env={**ENV, **stop_at("save:1", "runs/cpu/segment-1", marker)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid = self_stopped(marker, proc)
    saved = ckpt.read_manifest(tmp_path / "killed/results/runs/cpu/work")
    assert (saved["epoch"], saved["step"]) == (0, 1), saved
    os.kill(pid, signal.SIGKILL)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, output[-3000:]
    logs = tmp_path / "killed/results/logs/train/cpu"
    first = (logs / "segment-1.attempt1.log").read_text()
    assert "resumed from" not in first and "model=lenet" in first
    second = (logs / "segment-1.attempt2.log").read_text()
    assert (f"resumed from results/runs/cpu/work at epoch {saved['epoch'] + 1}, "
            f"batch {saved['step']}") in second  # exactly the save it was killed after
    assert (logs / "segment-1.log").read_text() == second  # the declared log: the last attempt
    snakemake(tmp_path / "whole", "--cores", 2, configfile=configs)  # its uninterrupted twin
    assert_bit_identical(state_of(tmp_path / "killed/results/runs/cpu/segment-1")["model"],
                         state_of(tmp_path / "whole/results/runs/cpu/segment-1")["model"])
    compared = cli("compare", tmp_path / "killed/results", tmp_path / "whole/results")
    assert "cpu  identical" in compared.stdout  # exit 0: every common run identical
    row = read_summary(tmp_path / "killed/results/summary.csv")[0]
    assert (row["status"], row["segments"], row["attempts"], row["early_stops"]) == \
        ("ok", "1", "2", "0")
    assert row["try_ends"] == "completed 1, killed 1"  # the killed try wrote no end


@pytest.mark.slow  # three segments of a local run: about 40 s
def test_segments_stopped_by_their_budget_get_extra_segments_up_to_max_extra(tmp_path):
    """Every segment's budget is spent when it starts (budget_s 0.01, margin 0): each
    trains one batch and stops. The workflow itself adds a segment after each early stop,
    which resumes where the last one stopped, until segments.max_extra extra segments ran;
    then it stops with the way out."""
    cfg = tmp_path / "budget.yaml"
    cfg.write_text("strategies: [cpu]\ndata: {source: synthetic, synthetic: {train_size: 1000, "
                   "test_size: 200}}\ntrain: {epochs: 1, batch_size: 100, log_interval_s: 100}\n"
                   "segments: {count: 1, budget_s: 0.01, margin_s: 0, max_extra: 2}\n")
    out = snakemake(tmp_path, "--cores", 2, configfile=cfg, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "run cpu: not finished after 3 segments; raise resources.runtime or " \
           "segments.max_extra" in text, text[-3000:]
    logs = tmp_path / "results/logs/train/cpu"
    for k in (1, 2, 3):
        m = ckpt.read_manifest(tmp_path / f"results/runs/cpu/segment-{k}")
        assert (m["epoch"], m["step"], m["done"]) == (0, k, False)
        assert f"stopping at epoch 1 batch {k}: time budget" in \
            (logs / f"segment-{k}.log").read_text()
    for k in (2, 3):
        assert (f"resumed from results/runs/cpu/segment-{k - 1} at epoch 1, batch {k - 1}\n"
                in (logs / f"segment-{k}.log").read_text())
    assert not (tmp_path / "results/runs/cpu/segment-4").exists()


@pytest.mark.slow  # two local runs of 3 segments: about 40 s
def test_keeping_only_the_last_weights_leaves_resume_and_the_summary_whole(tmp_path):
    """segments.keep_weights last: each segment resumes from the one before and then drops
    its weights (the best segment's stay); the final weights equal those of a run that
    keeps them all, the summary is the same, every segment keeps its metrics and manifest,
    one log file per try (segment-k.log is a link to it); resuming from a dropped segment
    is one clear error."""
    results = {}
    for keep in ("all", "last"):
        extra = tmp_path / f"{keep}.yaml"
        extra.write_text(f"train: {{epochs: 3}}\nsegments: {{count: 3, keep_weights: {keep}}}\n")
        work = tmp_path / keep
        snakemake(work, "--cores", 2, configfile=[CONFIGS / "local" / "config.yaml", extra])
        results[keep] = work / "results/runs/cpu"
    kept = sorted(p.parent.name for p in results["last"].glob("segment-*/state.pt"))
    accuracy = {k: metrics_of(results["last"] / f"segment-{k}")[-1]["test_acc"] for k in (1, 2, 3)}
    best = max((3, 2, 1), key=lambda k: accuracy[k])  # the latest of equals
    assert kept == sorted({f"segment-{best}", "segment-3"})
    assert len(list(results["all"].glob("segment-*/state.pt"))) == 3
    assert_bit_identical(state_of(results["all"] / "segment-3")["model"],
                         state_of(results["last"] / "segment-3")["model"])
    def learned(directory):
        return [(r["epoch"], r["train_loss"], r["test_acc"]) for r in metrics_of(directory)]

    for k in (1, 2):  # metrics and manifests stay
        assert learned(results["last"] / f"segment-{k}") == learned(results["all"] / f"segment-{k}")
    rows = {keep: summary_rows(tmp_path / keep)["cpu"] for keep in results}
    assert rows["last"]["test_acc"] == rows["all"]["test_acc"] and rows["last"]["status"] == "ok"
    logs = tmp_path / "last/results/logs/train/cpu"
    assert os.readlink(logs / "segment-2.log") == "segment-2.attempt1.log"  # one file a try
    dropped = next(k for k in (1, 2) if k != best)
    with pytest.raises(ckpt.CheckpointError, match=r"holds no weights: segments.keep_weights last"):
        ckpt.read_manifest(results["last"] / f"segment-{dropped}")
    again = snakemake(tmp_path / "last", "-n", configfile=[CONFIGS / "local" / "config.yaml",
                                                           tmp_path / "last.yaml"])
    assert "Nothing to be done" in again.stdout + again.stderr  # nothing retrains


def test_command_line_values_and_an_unwritable_results_folder(tmp_path):
    """`--config` as the README and issue reports write it: nested numbers arrive as strings
    and still plan; a results folder that cannot be written is one line naming the key."""
    local = CONFIGS / "local" / "config.yaml"
    out = snakemake(tmp_path, "-n", configfile=local, config=['sweep={"lr": [0.1, 0.2]}'])
    assert "cpu_lr0p1" in out.stdout and "cpu_lr0p2" in out.stdout
    refused = snakemake(tmp_path, "-n", configfile=local, config=["results=/proc/forbidden"],
                        check=False)
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "results: /proc/forbidden cannot be written here" in text
    assert "FileNotFoundError" not in text
