"""A site's own rules, from its documentation (controller/sites.py; issue 59): on Trillium
(CC_CLUSTER=trillium) a runtime under 15 minutes is refused at the plan, the workflow's own
short runtimes (autosize's floor, the environment record's) are raised to 15, a results
folder or working directory under $HOME or $PROJECT (read-only on its compute nodes) is
refused naming $SCRATCH, and `cifarflow controller-job` refuses in one line with the way
out, since jobs there cannot submit jobs. Elsewhere nothing changes."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from cifarflow.config import with_defaults
from cifarflow.controller import sites
from cifarflow.controller.plan import build_runs
from cifarflow.controller.sizing import Measured
from test_workflow_plan import bin_dir  # noqa: F401 - the fixture

TRILLIUM = {"CC_CLUSTER": "trillium"}


def runs(resources: dict) -> dict:
    return build_runs(with_defaults({"strategies": ["cpu"], "resources": resources}))


def test_the_site_is_found_by_cc_cluster_and_unknown_sites_keep_the_default():
    assert sites.current({"CC_CLUSTER": "Trillium"}).min_runtime == 15
    assert not sites.current(TRILLIUM).jobs_may_submit
    for elsewhere in ({}, {"CC_CLUSTER": "fir"}, {"CC_CLUSTER": ""}):
        site = sites.current(elsewhere)
        assert site.jobs_may_submit and site.min_runtime == 0 and not site.read_only_on_nodes


def test_a_runtime_under_the_sites_minimum_is_refused_at_the_plan(monkeypatch):
    monkeypatch.setenv("CC_CLUSTER", "trillium")
    with pytest.raises(ValueError, match=r"^resources.runtime: 10 minutes is under trillium's "
                                         r"minimum walltime of 15 minutes \(https://docs\."
                                         r"alliancecan.ca/wiki/Trillium_Quickstart\), which "
                                         r"Slurm there refuses: set resources.runtime: 15 or "
                                         r"more$"):
        runs({"runtime": 10})
    assert runs({"runtime": 15})["cpu"].resources["runtime"] == 15
    monkeypatch.delenv("CC_CLUSTER")
    assert runs({"runtime": 10})["cpu"].resources["runtime"] == 10  # elsewhere: as asked


def test_an_autosized_segment_is_raised_to_the_sites_minimum(monkeypatch, tmp_path):
    """A fast segment measured at 10 s: autosize would ask the floor (10 minutes);
    on Trillium the floor is the site's 15."""
    fast = Measured(peak_node_mb=610, wall_s=10, epochs=2, end_epoch=2)
    monkeypatch.setattr(Measured, "of_segment", staticmethod(lambda d: fast))
    config = {"runtime": 60, "autosize": True, "autosize_min_runtime": 10}
    assert runs(config)["cpu"].policy.request(["s1"], 4, 0).runtime == 10
    monkeypatch.setenv("CC_CLUSTER", "trillium")
    assert runs(config)["cpu"].policy.request(["s1"], 4, 0).runtime == 15


def test_a_folder_under_a_read_only_home_is_found(tmp_path):
    home, scratch = tmp_path / "home" / "me", tmp_path / "scratch" / "me"
    environ = {"HOME": str(home), "PROJECT": str(tmp_path / "project"), "CC_CLUSTER": "trillium"}
    site = sites.current(environ)
    assert sites.read_only_folder(home / "cifarflow" / "results", site, environ) == "HOME"
    assert sites.read_only_folder(tmp_path / "project" / "x", site, environ) == "PROJECT"
    assert sites.read_only_folder(scratch / "results", site, environ) is None
    assert sites.read_only_folder(home / "r", sites.current({}), environ) is None  # elsewhere


def test_the_controller_job_is_refused_where_jobs_cannot_submit_jobs(tmp_path):
    """Nothing is submitted: the refusal comes before the account is even looked up."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), **TRILLIUM,
           "PATH": os.path.dirname(sys.executable)}  # no sbatch, sacctmgr or squeue here
    out = subprocess.run([sys.executable, "-m", "cifarflow", "controller-job", "--", "-n"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == "", out
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("cifarflow controller-job: on trillium jobs cannot submit jobs (")
    assert "run the controller on the login node" in line and "tmux new -s sweep" in line


def test_results_under_a_home_read_only_on_the_nodes_are_refused_at_the_plan(
        tmp_path, bin_dir, monkeypatch):
    from test_workflow_plan import make_plan

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    plan = make_plan(home / "sweep", bin_dir)
    plan.checks.results_dir()  # elsewhere: writable here is enough
    monkeypatch.setenv("CC_CLUSTER", "trillium")
    with pytest.raises(Exception, match=r"^results: \S+/home/sweep/results is under \$HOME, "
                                        r"which is read-only on trillium's compute nodes "
                                        r"\(.*\): its training jobs could not write there\. "
                                        r"Work from \$SCRATCH"):
        plan.checks.results_dir()
    monkeypatch.chdir(home)
    plan = make_plan(tmp_path / "scratch", bin_dir)
    with pytest.raises(Exception, match=r"^the working directory \S+/home \(Snakemake's "
                                        r"\.snakemake and the jobs' Slurm logs\) is under "
                                        r"\$HOME"):
        plan.checks.results_dir()
