"""The project as a package: an offline editable install gives a working `cifarflow`
command; the wheel holds every module, the command, and dependencies that requirements.txt
pins; jobs import the workflow's own checkout first."""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ENV, PY, ROOT, snakemake, spec
from cifarflow.job_env import keep_slurm_job_values, put_engine_first

SUBCOMMANDS = ("fetch-data", "extract-data", "train", "record-env", "aggregate", "launch",
               "mps-run")


def project_copy(tmp_path: Path) -> Path:
    """What a clone holds of what the install reads: pyproject.toml, README.md (the long
    description), the package, and the schema the package reads at run time."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "scripts", project / "scripts",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "workflow" / "schemas", project / "workflow" / "schemas")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    return project


def run(cmd, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=120,
                         env={**env, **kw.pop("env", {})}, **kw)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def assert_help_lists_every_command(out: subprocess.CompletedProcess) -> None:
    assert out.stdout.startswith("usage: cifarflow ")
    assert all(command in out.stdout for command in SUBCOMMANDS), out.stdout


def test_offline_editable_install_gives_the_command(tmp_path):
    """`pip install --no-index --no-deps --no-build-isolation -e .` into a fresh venv whose
    only other packages are this venv's (pip, setuptools, numpy...), read through a .pth."""
    project = project_copy(tmp_path)
    env = tmp_path / "env"
    venv.create(env, with_pip=False)
    site = Path(run([env / "bin/python", "-c", "import sysconfig; "
                     "print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "project_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([env / "bin/python", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--no-build-isolation", "-e", project])

    imported = run([env / "bin/python", "-c", "import cifarflow; print(cifarflow.__file__)"],
                   cwd=tmp_path).stdout.strip()
    assert imported == str(project / "scripts/cifarflow/__init__.py")
    assert_help_lists_every_command(run([env / "bin/cifarflow", "--help"], cwd=tmp_path))
    # the package reads the schema through the checkout (synthetic data takes its defaults)
    run([env / "bin/cifarflow", "fetch-data", "--source", "synthetic", "--train-size", 50,
         "--test-size", 10, "--out-dir", tmp_path / "data"], cwd=tmp_path)
    assert (tmp_path / "data/cifar-10-python.tar.gz").stat().st_size > 0


def test_wheel_holds_every_module_the_command_and_pinned_dependencies(tmp_path):
    project = project_copy(tmp_path)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-index", "--no-deps",
         "--no-build-isolation", "-w", tmp_path / "wheels", project])
    [wheel] = (tmp_path / "wheels").glob("cifarflow-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        metadata = archive.read(f"{dist_info}/METADATA").decode()
    modules = sorted(p.relative_to(project / "scripts").as_posix()
                     for p in (project / "scripts/cifarflow").rglob("*.py"))
    assert sorted(n for n in names if n.endswith(".py")) == modules
    assert "cifarflow/strategies/base.py" in modules  # discovered at run time: must be there
    assert "[console_scripts]\ncifarflow = cifarflow.cli:main" in entry_points

    # every dependency is pinned in requirements.txt, at a version it accepts
    pins = pinned(ROOT / "requirements.txt")
    requires = [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    assert requires
    for req in requires:
        pin = pins.get(canonicalize_name(req.name))
        assert pin, f"{req.name} is a dependency but requirements.txt does not pin it"
        assert req.specifier.contains(pin, prereleases=True), f"{req} excludes {pin}"
        assert version(req.name) == pin, f"{req.name}: installed {version(req.name)}"

    target = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
         target, wheel])
    on_target = {"PYTHONPATH": str(target)}
    imported = run([sys.executable, "-c", "import cifarflow; print(cifarflow.__file__)"],
                   env=on_target, cwd=tmp_path).stdout.strip()
    assert imported == str(target / "cifarflow/__init__.py")
    assert_help_lists_every_command(run([target / "bin/cifarflow", "--help"], env=on_target,
                                        cwd=tmp_path))


def test_rules_call_the_installed_command_and_refuse_a_venv_without_it(tmp_path):
    local = ROOT / "tests/configs/local/config.yaml"
    plan = snakemake(tmp_path, "-n", "-p", configfile=local).stdout
    command = Path(PY).parent / "cifarflow"
    assert f"{command} fetch-data --source synthetic" in plan
    # the segment is started by the launcher (its own srun step in a Slurm job)
    assert re.search(rf"\(\S*python\S* -m cifarflow launch --nproc 1 .*-- {re.escape(str(command))} "
                     r"train --spec results/runs/cpu/spec.json", plan), plan[-3000:]
    # env.mode venv: its own `cifarflow` once activated, if it is installed there
    project_venv = Path(PY).parent.parent
    plan = snakemake(tmp_path, "-n", "-p", configfile=local,
                     config=[f"env={{'mode': 'venv', 'venv': '{project_venv}'}}"]).stdout
    activate = re.escape(f"source {project_venv}/bin/activate")
    assert re.search(rf"{activate} && +python -m cifarflow launch --nproc 1 .*-- cifarflow train "
                     r"--spec", plan), plan[-3000:]
    bare = tmp_path / "bare-venv"
    venv.create(bare, with_pip=False)
    out = snakemake(tmp_path, "-n", configfile=local, check=False,
                    config=[f"env={{'mode': 'venv', 'venv': '{bare}'}}"])
    assert out.returncode != 0
    assert (f"{bare}/bin/cifarflow not found: install this project into that environment with "
            f"`pip install --no-deps -e {ROOT}`") in out.stdout + out.stderr


def test_jobs_import_the_workflows_own_checkout_first(tmp_path):
    environ = {"PYTHONPATH": os.pathsep.join(["/elsewhere/scripts", "/site"])}
    put_engine_first(tmp_path, environ)
    assert environ["PYTHONPATH"] == os.pathsep.join([str(tmp_path), "/elsewhere/scripts", "/site"])
    put_engine_first(tmp_path, environ)  # common.smk is read again in every job: no repeats
    assert environ["PYTHONPATH"].split(os.pathsep).count(str(tmp_path)) == 1
    environ = {}
    put_engine_first(tmp_path, environ)
    assert environ["PYTHONPATH"] == str(tmp_path)


def test_slurm_values_are_kept_once_per_job():
    environ = {"SLURM_JOB_ID": "7", "SLURM_TMPDIR": "/localscratch/7", "SLURM_RESTART_COUNT": "1"}
    keep_slurm_job_values(environ)
    assert (environ["CIFARFLOW_SLURM_JOB_ID"], environ["CIFARFLOW_SLURM_TMPDIR"],
            environ["CIFARFLOW_SLURM_RESTART_COUNT"]) == ("7", "/localscratch/7", "1")
    del environ["SLURM_TMPDIR"], environ["SLURM_RESTART_COUNT"]  # what the jobstep drops
    keep_slurm_job_values(environ)
    assert environ["CIFARFLOW_SLURM_TMPDIR"] == "/localscratch/7"
    environ["SLURM_JOB_ID"] = "8"  # another job (a retry) inheriting the old values
    keep_slurm_job_values(environ)
    assert (environ["CIFARFLOW_SLURM_JOB_ID"], environ["CIFARFLOW_SLURM_TMPDIR"]) == ("8", "")
    outside = {}
    keep_slurm_job_values(outside)
    assert outside == {}


def pinned(requirements: Path) -> dict:
    """name -> pinned version of a requirements file, following its `-r` includes."""
    pins = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            pins.update(pinned(requirements.parent / line[3:].strip()))
        elif line:
            pin = Requirement(line)
            pins[canonicalize_name(pin.name)] = str(pin.specifier).removeprefix("==")
    return pins


def installed_closure(names) -> dict:
    """name -> Distribution of these installed distributions and everything they require
    here (markers evaluated without extras)."""
    from importlib.metadata import PackageNotFoundError, distribution

    todo, found = list(names), {}
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            found[name] = dist = distribution(name)
        except PackageNotFoundError:
            continue
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def test_a_job_venv_needs_requirements_train_only(tmp_path, cifar_dir):
    """env.mode slurm_tmpdir installs requirements-train.txt alone in each job. A venv
    holding exactly that (its distributions and what they require, linked from this venv;
    the engine from PYTHONPATH, as in the jobs) runs a segment with TensorBoard, a
    Lightning segment and the environment record."""
    dists = installed_closure(pinned(ROOT / "requirements-train.txt"))
    assert not {"snakemake", "pandas", "matplotlib", "pytest", "tabulate"} & set(dists)
    job_venv = tmp_path / "job-venv"
    venv.create(job_venv, with_pip=False)
    site = Path(sysconfig.get_path("purelib"))
    target = Path(sysconfig.get_path("purelib", vars={"base": str(job_venv)}))
    for top in {Path(f).parts[0] for d in dists.values() for f in d.files or []
                if not str(f).startswith("..")}:
        if (site / top).exists() and not (target / top).exists():
            (target / top).symlink_to(site / top)
    python = job_venv / "bin" / "python"
    probe = subprocess.run([python, "-c", "import torch, lightning; import pandas"], env=ENV,
                           capture_output=True, text=True)
    assert "No module named 'pandas'" in probe.stderr, probe.stderr  # torch yes, pandas no
    for strategy in ("cpu", "lightning"):
        out = subprocess.run([python, "-m", "cifarflow", "train", "--spec",
                              spec(strategy=strategy, epochs=1), "--data", cifar_dir, "--out",
                              tmp_path / strategy, "--tensorboard", tmp_path / "tb" / strategy,
                              "--threads", "1"], env=ENV, capture_output=True, text=True)
        assert out.returncode == 0 and "(done)" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    out = subprocess.run([python, "-m", "cifarflow", "record-env", "--out", tmp_path / "env.json",
                          "--freeze", tmp_path / "freeze.txt"], env=ENV, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pandas" not in (tmp_path / "freeze.txt").read_text()
