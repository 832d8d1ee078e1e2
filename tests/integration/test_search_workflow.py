"""sweep.search through snakemake: a 3-round TPE search of tiny cpu trials (6 a round, the
worse half pruned after segment 1), interrupted after round 1 and run again; the study read
back by Optuna; the dashboard rendered in headless Chromium; bad input at `snakemake -n`."""

import json
import re
import select
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import PY, ROOT, cli, snakemake, summary_rows
from test_workflow import VisibleText, chromium_dom

from cifarflow.results.study import load_studies

CONFIG = ROOT / "tests" / "configs" / "search" / "config.yaml"
pytestmark = pytest.mark.slow  # 18 trials of 2 epochs, about 2 minutes here


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    work = tmp_path_factory.mktemp("search")
    dry = snakemake(work, "-n", configfile=CONFIG)
    study = next(line.split()[2] for line in (dry.stdout + dry.stderr).splitlines()
                 if line.startswith("sweep.search: study "))
    # interrupted between rounds: only up to round 2's ask (round 1 trained and told)
    snakemake(work, "--cores", 2, f"results/search/{study}/round-2.json", configfile=CONFIG)
    asked_early = {t.user_attrs["run"]: t.params for t in
                   load_studies(work / "results/search/study.journal")[0].trials}
    out = snakemake(work, "--cores", 2, configfile=CONFIG)
    again = snakemake(work, "--cores", 2, configfile=CONFIG)
    return work, study, dry.stdout + dry.stderr, asked_early, out.stdout + out.stderr, \
        again.stdout + again.stderr


def test_the_dry_run_says_what_was_sampled(searched):
    _, study, dry, _, _, _ = searched
    assert f"sweep.search: study {study} (results/search/study.journal): 6 trial(s) x 3 " \
        "round(s), sampler tpe (seed 1), max test_acc; 6 sampled:" in dry
    assert "  lr: log_uniform [1e-05, 1.0]: sampled " in dry
    assert "  optimizer: choice ['sgd']: sgd 6" in dry
    assert "round(s) 2, 3: asked of the study once the round before is told" in dry


def test_every_trial_is_told_once_and_nothing_asked_twice(searched):
    work, study, _, asked_early, _, again = searched
    one, = load_studies(work / "results/search/study.journal")
    assert one.study_name == study
    runs = [t.user_attrs["run"] for t in one.trials]
    assert len(runs) == len(set(runs)) == 18
    assert sorted(runs) == sorted(summary_rows(work))
    assert {t.state.name for t in one.trials} <= {"COMPLETE", "PRUNED"}
    # what was asked before the interruption stands: round 2's trials kept their values
    assert len(asked_early) == 12
    assert {t.user_attrs["run"]: t.params for t in one.trials
            if t.user_attrs["run"] in asked_early} == asked_early
    assert "Nothing to be done" in again


def test_pruned_trials_are_pruned_in_the_study_and_the_summary(searched):
    work, _, _, _, _, _ = searched
    one, = load_studies(work / "results/search/study.journal")
    rows = summary_rows(work)
    for t in one.trials:
        row = rows[t.user_attrs["run"]]
        assert row["trial_state"] == t.state.name and int(row["trial"]) == t.number
        assert float(row["sweep_lr"]) == pytest.approx(t.params["lr"], rel=1e-5)
        if t.state.name == "PRUNED":  # told with its last value, the segment it reached
            assert (row["status"], row["pruned_at"]) == ("pruned", "1")
            assert t.value == float(row["test_acc"]) == t.intermediate_values[1]
        else:
            assert row["status"] == "ok" and t.value == pytest.approx(float(row["test_acc"]))
    per_round = {}
    for t in one.trials:
        per_round.setdefault(t.user_attrs["round"], []).append(t.state.name)
    assert {r: sorted(s) for r, s in per_round.items()} == \
        {r: ["COMPLETE"] * 3 + ["PRUNED"] * 3 for r in (1, 2, 3)}


def test_summary_advice_and_show_carry_the_study(searched):
    work, study, _, _, _, _ = searched
    advice = (work / "results/advice.md").read_text()
    assert f"### Study {study}" in advice and "18 trials: 9 complete, 9 pruned" in advice
    assert "Parameter importances (fANOVA): " in advice
    assert (work / f"results/plots/search-{study}-history.png").stat().st_size > 5000
    shown = cli("show", str(work / "results")).stdout
    one, = load_studies(work / "results/search/study.journal")
    best = max((t for t in one.trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert f"- trial {best.number} ({best.user_attrs['run']}): {best.value:.4g}: lr=" in shown


def announced_port(server: subprocess.Popen, timeout: float = 60) -> int:
    """The port `cifarflow dashboard` bound itself (port 0: the system's free one, no race
    with another process) and printed; fails loudly with what it said if it never does."""
    said, deadline = [], time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([server.stdout], [], [], max(0.0, deadline - time.time()))
        line = server.stdout.readline() if ready else ""
        said.append(line)
        found = re.search(r"on http://127\.0\.0\.1:(\d+)/dashboard/", line)
        if found:
            return int(found.group(1))
        if not line and server.poll() is not None:
            break
    pytest.fail(f"cifarflow dashboard printed no port in {timeout} s:\n{''.join(said)[-3000:]}")


def answers(port: int, timeout: float = 60) -> None:
    """The server answers HTTP on `port` within `timeout`, or the test fails saying so."""
    deadline, error = time.time() + timeout, None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError as exc:
            error = exc
        time.sleep(0.2)
    pytest.fail(f"the dashboard on port {port} did not answer in {timeout} s: {error}")


def rendered(url: str, profile) -> list[str]:
    seen = VisibleText()
    seen.feed(chromium_dom(url, profile))
    return seen.lines


def test_the_dashboard_renders_the_study_in_chromium(searched, tmp_path):
    work, study, _, _, _, _ = searched
    server = subprocess.Popen([str(Path(PY).parent / "cifarflow"), "dashboard", str(work / "results")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = announced_port(server)
        answers(port)
        base = f"http://127.0.0.1:{port}/dashboard"
        assert any(study in line for line in rendered(f"{base}/", tmp_path / "p1"))
        trials = rendered(f"{base}/studies/0/trials", tmp_path / "p2")
        assert "18 Trials" in trials, trials[:40]
        page = rendered(f"{base}/studies/0", tmp_path / "p3")
        one, = load_studies(work / "results/search/study.journal")
        best = one.best_trial
        at = page.index(f"Best Trial (number={best.number})")
        assert float(page[at + 1]) == pytest.approx(best.value)
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("search, message", [
    ('{"space": {"lr": {"normal": [0, 1]}}}', "'normal'"),
    ('{"space": {"epochs": {"int": [1, 3]}}}', "'epochs' is not one of"),
    ('{"space": {"lr": {"uniform": [0.5, 0.1]}}}',
     "sweep.search.space.lr: uniform [0.5, 0.1]: low must be below high"),
    ('{"space": {"lr": {"log_uniform": [0, 1]}}}',
     "sweep.search.space.lr: log_uniform [0, 1]: a log range must lie above 0"),
])
def test_bad_input_is_one_error_at_the_dry_run(tmp_path, search, message):
    config = yaml.safe_load(CONFIG.read_text())
    config["sweep"] = {"search": json.loads(search)}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(tmp_path, "-n", configfile=tmp_path / "bad.yaml", check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and message in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
