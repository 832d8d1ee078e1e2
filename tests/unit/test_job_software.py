"""What a plan's jobs install (env.mode slurm_tmpdir): the training stack its runs import and
nothing more, the refusals at plan time (a strategy's missing package, a package index that
compute nodes cannot reach), and the optional packages around it: installed one by one,
TensorBoard's absence said once, `cifarflow dashboard` on a free port."""

import getpass
import socket
import sys
import threading
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import probe_wheel
from test_workflow_plan import bin_dir, make_plan  # noqa: F401 (bin_dir: a fixture)
from cifarflow.cli import cmd_dashboard, parser
from cifarflow.controller import optional_packages
from cifarflow.controller.optional_packages import install_optional, not_installed, read_optional
from cifarflow.controller.plan import PlanError
from cifarflow.controller.wheelhouse import CORE_STACK, installed_closure, training_stack
from cifarflow.engine.report import Reporter
from cifarflow.results.study import serve_dashboard

SLURM_TMPDIR = {"mode": "slurm_tmpdir"}


def accept(requirements, index, checks):
    return True


def pins(plan) -> set:
    plan.software.prepare_job_venvs(check=accept)
    return {line.split("==")[0] for line in plan.software.job_requirements.read_text().splitlines()
            if not line.startswith("#")}


def test_a_cpu_plan_installs_no_lightning_and_no_tensorboard_when_curves_are_off(tmp_path, bin_dir):
    quiet = make_plan(tmp_path, bin_dir, env=SLURM_TMPDIR, train={"tensorboard": False})
    assert training_stack(quiet.runs.values()) == CORE_STACK
    installed = pins(quiet)
    assert {"torch", "torchvision", "numpy", "pyyaml"} <= installed
    assert not {"lightning", "tensorboard", "nvidia-ml-py", "lightning-utilities"} & installed
    curves = pins(make_plan(tmp_path, bin_dir, env=SLURM_TMPDIR))  # train.tensorboard: true
    assert "tensorboard" in curves and "lightning" not in curves
    both = make_plan(tmp_path, bin_dir, env=SLURM_TMPDIR, strategies=["cpu", "lightning"])
    assert training_stack(both.runs.values()) == CORE_STACK + ("lightning", "tensorboard")
    gpu = make_plan(tmp_path, bin_dir, env=SLURM_TMPDIR, strategies=["gpu"],
                    train={"tensorboard": False})
    assert training_stack(gpu.runs.values()) == CORE_STACK + ("nvidia-ml-py",)


def test_an_optional_package_missing_here_is_left_out_with_a_warning(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, env=SLURM_TMPDIR, strategies=["gpu"])

    def without_tensorboard(names):
        return installed_closure([n for n in names if n != "tensorboard"])

    plan.software.prepare_job_venvs(installed=without_tensorboard, check=accept)
    assert plan.log.warnings == ["WARNING: tensorboard is not installed here, so the job venvs "
                                 "go without it: no TensorBoard curves (cifarflow "
                                 "install-optional)"]
    assert "\nnvidia-ml-py==" in plan.software.job_requirements.read_text()

    def without_torch(names):
        return {name: dist for name, dist in installed_closure(names).items() if name != "torch"}

    with pytest.raises(PlanError, match="torch is not installed here: pip install -r "
                                        "requirements.txt"):
        plan.software.prepare_job_venvs(installed=without_torch, check=accept)


def test_a_lightning_run_without_lightning_is_one_error_naming_the_package(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, strategies=["cpu", "lightning"])
    plan.software.check_strategy_packages()  # installed here
    empty_venv = tmp_path / "bare"
    (empty_venv / "lib/python3.11/site-packages").mkdir(parents=True)
    lacking = not_installed("lightning", empty_venv)
    assert lacking.startswith("it needs lightning>=2.0,<3 (the lightning strategy")
    assert "cifarflow install-optional --no-index" in lacking
    with pytest.raises(PlanError) as refused:
        plan.software.check_strategy_packages(lacking=lambda name, prefix: not_installed(name, empty_venv))
    text = str(refused.value)
    assert text.startswith("strategy lightning (config strategies): it needs lightning>=2.0,<3")
    assert text.endswith("or take lightning out of strategies") and "\n" not in text
    make_plan(tmp_path, bin_dir).software.check_strategy_packages(  # no lightning run: not asked
        lacking=lambda name, prefix: pytest.fail(f"asked about {name}"))


def test_pip_no_index_false_is_refused_under_the_slurm_profile(tmp_path, bin_dir):
    env = {**SLURM_TMPDIR, "pip_no_index": False}
    slurm = make_plan(tmp_path, bin_dir, jobs_at_once=20, env=env)
    with pytest.raises(PlanError) as refused:
        slurm.software.prepare_job_venvs(check=accept)
    text = str(refused.value)
    assert "compute nodes reach no package index" in text
    assert "env.pip_no_index" in text and "env.find_links" in text
    make_plan(tmp_path, bin_dir, env=env).software.prepare_job_venvs(check=accept)  # local: may
    make_plan(tmp_path, bin_dir, jobs_at_once=20, env={"pip_no_index": False}) \
        .software.prepare_job_venvs(check=accept)  # env.mode current: no pip in jobs


def test_optional_packages_install_one_by_one_and_the_missing_are_named(tmp_path):
    wheels = probe_wheel(tmp_path / "wheels")
    listed = tmp_path / "optional.txt"
    listed.write_text("# what some runs need\ncifarflow-absent>=1  # a feature we go without\n"
                      "cifarflow-probe==0.1  # the probe's feature\n")
    assert [(p.name, p.purpose) for p in read_optional(listed)] == [
        ("cifarflow-absent", "a feature we go without"), ("cifarflow-probe", "the probe's feature")]
    said = []
    target = tmp_path / "site"  # not this venv
    missing = install_optional(["--no-index", "--find-links", str(wheels), "--target",
                                str(target)], listed, say=said.append)
    assert [p.name for p, _ in missing] == ["cifarflow-absent"]
    assert said[0].startswith("MISSING cifarflow-absent>=1 (") and \
        said[0].endswith("): a feature we go without")
    assert said[1] == "installed cifarflow-probe==0.1: the probe's feature"
    assert said[2].startswith("1 optional package(s) not installed") and "cifarflow-absent" in said[2]
    assert (target / "cifarflow_probe/__init__.py").is_file()


def test_the_repository_optional_list_names_what_each_is_for():
    assert {p.name: bool(p.purpose) for p in read_optional()} == {
        "lightning": True, "tensorboard": True, "nvidia-ml-py": True, "optuna-dashboard": True}


def test_without_tensorboard_curves_are_not_written_and_it_is_said_once(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    report = Reporter(SimpleNamespace(is_main=True, device="cpu"), tmp_path / "tb")
    said = []
    report.say = said.append
    report.open(0)
    report.batch_loss(1.0, 1)
    report.saved()
    assert said == ["TensorBoard curves not written: tensorboard is not installed "
                    "(cifarflow install-optional, or train.tensorboard: false)"]
    assert report.board is None and not (tmp_path / "tb").exists()


def test_the_dashboard_picks_a_free_port_and_prints_the_ssh_line(tmp_path):
    journal = tmp_path / "study.journal"
    said = []
    server = serve_dashboard(journal, "127.0.0.1", None, say=said.append, serve=False)
    try:
        port = server.server_port
        assert port > 0
        assert f"http://127.0.0.1:{port}/dashboard/" in said[0]
        assert f"ssh -L {port}:localhost:{port} {getpass.getuser()}@{socket.getfqdn()}" in said[0]
        threading.Thread(target=server.handle_request, daemon=True).start()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/", timeout=30) as page:
            assert page.status == 200
    finally:
        server.server_close()
    with socket.socket() as s:  # --port: that one
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    given = serve_dashboard(journal, "127.0.0.1", free, say=said.append, serve=False)
    given.server_close()
    assert given.server_port == free and f"ssh -L {free}:localhost:{free} " in said[1]
    assert parser().parse_args(["dashboard"]).port is None


def test_the_dashboard_without_optuna_dashboard_is_one_clear_error(tmp_path, monkeypatch):
    (tmp_path / "study.journal").write_text("")
    monkeypatch.setattr(optional_packages, "is_installed", lambda name, prefix=None: False)
    with pytest.raises(SystemExit) as stopped:
        cmd_dashboard(parser().parse_args(["dashboard", str(tmp_path / "study.journal")]))
    assert str(stopped.value).startswith("cifarflow dashboard: it needs optuna-dashboard>=0.16,<1 "
                                         "(`cifarflow dashboard` over a search's study")
