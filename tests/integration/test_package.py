"""The project as a package: an offline editable install gives a working `cifarflow`
command; the wheel holds every module, the command, and dependencies that requirements.txt
pins; jobs import the workflow's own checkout first."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ENV, PY, ROOT, build_wheelhouse, snakemake, spec
from cifarflow.job.job_env import prologue, put_engine_first
from cifarflow.jobfacts import job_fact, keep_slurm_job_values
from cifarflow.config import with_defaults
from cifarflow.controller.plan import build_runs
from cifarflow.controller.wheelhouse import installed_closure, training_stack

SUBCOMMANDS = ("fetch-data", "extract-data", "train", "record-env", "aggregate", "show",
               "launch", "mps-run")


def project_copy(tmp_path: Path) -> Path:
    """What a clone holds of what the install reads: pyproject.toml, README.md (the long
    description), requirements.txt and requirements-optional.txt (the dependencies, the
    `optional` extra), the package, and the schema the package reads at run time."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "scripts", project / "scripts",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "workflow" / "schemas", project / "workflow" / "schemas")
    for name in ("pyproject.toml", "README.md", "requirements.txt", "requirements-optional.txt"):
        shutil.copy(ROOT / name, project / name)
    return project


def run(cmd, timeout=120, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=timeout,
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


def test_wheel_holds_every_module_the_command_and_the_ranges_constraints_pin(tmp_path):
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
    assert "cifarflow/engine/strategies/base.py" in modules  # discovered at run time: must be there
    assert "[console_scripts]\ncifarflow = cifarflow.cli:main" in entry_points

    # the dependencies are requirements.txt's ranges; constraints.txt pins each at a
    # version the range accepts, the one installed here
    requires = [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    core = [str(r) for r in requires if r.marker is None]
    assert sorted(core) == sorted(map(str, requirements_in(ROOT / "requirements.txt")))
    extra = [r for r in requires if r.marker is not None]  # pip install 'cifarflow[optional]'
    assert all(r.marker.evaluate({"extra": "optional"}) for r in extra)
    assert sorted(f"{r.name}{r.specifier}" for r in extra) == \
        sorted(map(str, requirements_in(ROOT / "requirements-optional.txt")))
    pins = pinned(ROOT / "constraints.txt")
    for req in requires:
        pin = pins.get(canonicalize_name(req.name))
        assert pin, f"{req.name} is a dependency but constraints.txt does not pin it"
        assert req.specifier.contains(pin, prereleases=True), f"{req} excludes {pin}"
        assert version(req.name) == pin, f"{req.name}: installed {version(req.name)}"
    assert set(pins) == {canonicalize_name(r.name) for r in requires}  # and nothing else

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
    assert re.search(rf"\(export PYTHONPATH=\S+ && \S*python\S* -m cifarflow launch --cpus-per-task \d+ -- {re.escape(str(command))} "
                     r"train --spec results/runs/cpu/spec.json", plan), plan[-3000:]
    # env.mode venv: its own `cifarflow` once activated, if it is installed there
    project_venv = Path(PY).parent.parent
    plan = snakemake(tmp_path, "-n", "-p", configfile=local,
                     config=[f"env={{'mode': 'venv', 'venv': '{project_venv}'}}"]).stdout
    activate = re.escape(f"source {project_venv}/bin/activate")
    assert re.search(rf"{activate} && +python -m cifarflow launch --cpus-per-task \d+ -- cifarflow train "
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


# what a job's Python prints: which numpy and which engine it imports
JOB_PYTHON = "import numpy, cifarflow; print(numpy.__version__, cifarflow.__file__)"
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def shadowing_numpy(tmp_path: Path) -> Path:
    """A folder holding a `numpy` package, as a scipy-stack module puts on PYTHONPATH."""
    (tmp_path / "stack/numpy").mkdir(parents=True)
    (tmp_path / "stack/numpy/__init__.py").write_text('__version__ = "1.0.0+shadow"\n')
    return tmp_path / "stack"


def job_env(modules: list[str]) -> dict:
    return with_defaults({"env": {"modules": modules}})["env"]


def in_bash(script: str, pythonpath: Path) -> list[str]:
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(pythonpath)})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


def test_a_job_imports_its_own_numpy_whatever_the_login_shell_put_on_pythonpath(tmp_path):
    """--export=ALL hands a job the login shell's PYTHONPATH: a scipy-stack's numpy there
    wins over the job's own. After the prologue (job_env.prologue: `module purge` where a
    `module` command exists, env.modules, PYTHONPATH the engine's alone) the job's Python
    imports the real numpy and this checkout's engine."""
    stack = shadowing_numpy(tmp_path)
    job = f"{PY} -c {shlex.quote(JOB_PYTHON)}"
    assert in_bash(job, stack)[0] == "1.0.0+shadow"  # what a job imported before
    calls = tmp_path / "module-calls"  # Lmod's `module` is a shell function, exported
    module = f'module() {{ echo "$*" >> {calls}; }}; export -f module; '
    start = prologue(job_env(["StdEnv/2023", "python/3.11"]), ROOT, tmp_path / "r.txt")
    assert in_bash(module + start + job, stack) == [
        version("numpy"), str(ROOT / "scripts/cifarflow/__init__.py")]
    assert calls.read_text() == "purge\nload StdEnv/2023 python/3.11\n"
    # no `module` command at all (a cluster without modules), none named: still clean
    assert in_bash(prologue(job_env([]), ROOT, tmp_path / "r.txt") + job, stack)[0] == \
        version("numpy")


@pytest.mark.skipif(not LMOD_INIT.is_file(), reason="no Lmod here (Debian's lmod)")
def test_module_purge_with_lmod_unloads_the_login_shells_modules(tmp_path):
    """With Debian's Lmod: a module loaded in the login shell that puts a numpy on
    PYTHONPATH is gone once the prologue purged and loaded env.modules."""
    stack = shadowing_numpy(tmp_path)
    for name, body in {"shadow/1.0": f'prepend_path("PYTHONPATH", "{stack}")',
                       "tidy/1.0": 'setenv("CIFARFLOW_TIDY", "loaded")'}.items():
        (tmp_path / "modules" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "modules" / f"{name}.lua").write_text(body + "\n")
    login = (f"source {LMOD_INIT} && export MODULEPATH={tmp_path / 'modules'} && "
             "module load shadow/1.0 && ")
    job = f"{PY} -c {shlex.quote(JOB_PYTHON)}; echo $CIFARFLOW_TIDY; module -t list 2>&1"
    assert in_bash(login + job, tmp_path)[0] == "1.0.0+shadow"
    start = prologue(job_env(["tidy/1.0"]), ROOT, tmp_path / "r.txt")
    found = in_bash(login + start + job, tmp_path)
    assert found[:3] == [version("numpy"), str(ROOT / "scripts/cifarflow/__init__.py"), "loaded"]
    assert "shadow/1.0" not in found and "tidy/1.0" in found


def test_slurm_values_are_kept_once_per_job():
    asked = []

    def times_of(job):
        asked.append(job)
        return 1796500000.0, None  # the end; no answer for the wait

    def keep(environ):
        keep_slurm_job_values(environ, times_of)

    environ = {"SLURM_JOB_ID": "7", "SLURM_TMPDIR": "/localscratch/7", "SLURM_RESTART_COUNT": "1"}
    keep(environ)
    assert (environ["CIFARFLOW_SLURM_JOB_ID"], environ["CIFARFLOW_SLURM_TMPDIR"],
            environ["CIFARFLOW_SLURM_RESTART_COUNT"], environ["CIFARFLOW_SLURM_JOB_END_TIME"],
            environ["CIFARFLOW_SLURM_QUEUE_WAIT_S"]) == ("7", "/localscratch/7", "1",
                                                          "1796500000.0", "")
    del environ["SLURM_TMPDIR"], environ["SLURM_RESTART_COUNT"]  # what the jobstep drops
    keep(environ)
    assert environ["CIFARFLOW_SLURM_TMPDIR"] == "/localscratch/7"
    assert asked == ["7"]  # one question per job, not once per parse
    environ["SLURM_JOB_ID"] = "8"  # another job (a retry) inheriting the old values
    keep(environ)
    assert (environ["CIFARFLOW_SLURM_JOB_ID"], environ["CIFARFLOW_SLURM_TMPDIR"]) == ("8", "")
    assert asked[1:] == ["8"]
    outside = {}
    keep(outside)
    assert outside == {} and len(asked) == 2


def test_a_rank_reads_the_kept_job_facts_and_asks_slurm_only_where_none_were_kept():
    def never(job):
        raise AssertionError(f"a rank asked Slurm about job {job}")

    kept = {"SLURM_JOB_ID": "7", "CIFARFLOW_SLURM_JOB_ID": "7",
            "CIFARFLOW_SLURM_JOB_END_TIME": "1796500000.0", "CIFARFLOW_SLURM_QUEUE_WAIT_S": ""}
    assert job_fact("JOB_END_TIME", never, kept) == 1796500000.0
    assert job_fact("QUEUE_WAIT_S", never, kept) is None  # asked at the start, no answer
    assert job_fact("JOB_END_TIME", never, {}) is None  # no job
    by_hand = {"SLURM_JOB_ID": "9", **{k: v for k, v in kept.items() if k != "SLURM_JOB_ID"}}
    assert job_fact("JOB_END_TIME", lambda job: float(job), by_hand) == 9.0  # not its job's


def requirements_in(path: Path) -> list[Requirement]:
    """The requirements of a requirements file, following its `-r` includes."""
    found = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found += requirements_in(path.parent / line[3:].strip())
        elif line:
            found.append(Requirement(line))
    return found


def pinned(requirements: Path) -> dict:
    """name -> pinned version of a requirements file, following its `-r` includes."""
    return {canonicalize_name(r.name): str(r.specifier).removeprefix("==")
            for r in requirements_in(requirements)}


def venv_of(dists: dict, path: Path) -> Path:
    """A venv holding exactly these distributions, linked from this venv, with their
    console scripts (what pip writes into bin/); its python."""
    venv.create(path, with_pip=False)
    site = Path(sysconfig.get_path("purelib"))
    target = Path(sysconfig.get_path("purelib", vars={"base": str(path)}))
    for top in {Path(f).parts[0] for d in dists.values() for f in d.files or []
                if not str(f).startswith("..")}:
        if (site / top).exists() and not (target / top).exists():
            (target / top).symlink_to(site / top)
    python = path / "bin" / "python"
    for dist in dists.values():
        for entry in dist.entry_points.select(group="console_scripts"):
            module, _, func = entry.value.partition(":")
            script = path / "bin" / entry.name
            script.write_text(f"#!{python}\nimport sys\nfrom {module} import {func}\n"
                              f"sys.exit({func}())\n")
            script.chmod(0o755)
    return python


@pytest.mark.slow  # builds a venv: about 15 s
def test_a_job_venv_needs_the_training_stack_only(tmp_path, cifar_dir):
    """env.mode slurm_tmpdir installs what the plan's runs import alone in each job (at this
    venv's versions: cifarflow/controller/wheelhouse.py). A venv holding exactly that for a
    plan of cpu and lightning runs (its distributions and what they require, linked from
    this venv; the engine from PYTHONPATH, as in the jobs) runs a segment with TensorBoard,
    a Lightning segment and the environment record."""
    runs = build_runs(with_defaults({"strategies": ["cpu", "lightning"]}))
    dists = installed_closure(training_stack(runs.values()))
    assert not {"snakemake", "pandas", "matplotlib", "pytest", "tabulate"} & set(dists)
    python = venv_of(dists, tmp_path / "job-venv")
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


README_COMMANDS = {  # the README's everyday commands -> distributions they import beyond the core
    "snakemake --report": {"snakemake", "pygments", "jinja2", "docutils"},
    "snakemake summarize_partial": {"snakemake", "pandas", "matplotlib", "tabulate"},
    "cifarflow show": {"pandas"},
}
OPTIONAL_COMMANDS = {  # what requirements-optional.txt adds (cifarflow install-optional)
    "make tensorboard": {"tensorboard"},
    "cifarflow dashboard": {"optuna-dashboard"},
    "strategies: [lightning]": {"lightning", "lightning-utilities"},
}


def test_requirements_closure_holds_what_the_readme_commands_import():
    """What `pip install -r requirements.txt` brings (this venv's versions, extras
    followed): snakemake's report needs pygments, which only its `reports` extra brings;
    the optional list brings the rest, and requirements.txt needs none of it."""
    dists = installed_closure(requirements_in(ROOT / "requirements.txt"))
    for command, needs in README_COMMANDS.items():
        assert needs <= set(dists), f"{command}: requirements.txt lacks {needs - set(dists)}"
    assert "pytest" not in dists  # the dev packages are not part of it
    optional = installed_closure(requirements_in(ROOT / "requirements-optional.txt"))
    for command, needs in OPTIONAL_COMMANDS.items():
        assert needs <= set(optional), f"{command}: the optional list lacks {needs - set(optional)}"
        assert not {"lightning", "tensorboard", "optuna-dashboard"} & needs & set(dists), command


@pytest.mark.slow
def test_every_readme_command_runs_in_an_environment_of_requirements_txt_alone(tmp_path):
    """A venv holding exactly the closure of requirements.txt at this machine's versions
    (linked from this venv: a fresh install would fetch ~5 GB of torch and CUDA wheels)
    plus this project installed as `make run` does (`pip install --no-deps -e`),
    activated: the README's everyday commands, a local run of the test config included,
    all succeed there, none of the optional packages installed."""
    python = venv_of(installed_closure(requirements_in(ROOT / "requirements.txt")),
                     tmp_path / "venv")
    assert subprocess.run([python, "-c", "import pytest"], capture_output=True).returncode != 0
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index",
         "--no-deps", "--no-build-isolation", "-e", project_copy(tmp_path)])
    bin_dir = python.parent
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "VIRTUAL_ENV": str(python.parent.parent)}
    work = tmp_path / "work"
    smk = ["snakemake", "-s", ROOT / "Snakefile", "--directory", work, "--configfile",
           ROOT / "tests/configs/local/config.yaml"]
    assert_help_lists_every_command(run(["cifarflow", "--help"], env=env))
    assert "Nothing to be done" not in run([*smk, "-n"], env=env).stdout
    run([*smk, "--cores", "2"], env=env, timeout=600)
    assert run(["cifarflow", "show", work / "results"], env=env).stdout.startswith("1 run: 1 ok")
    run([*smk, "--report", work / "results/report.html"], env=env, timeout=300)
    assert (work / "results/report.html").stat().st_size > 10_000
    run([*smk, "--cores", "1", "summarize_partial"], env=env, timeout=300)
    # tensorboard is optional: the run went on without its curves, and said so once
    log = (work / "results/logs/train/cpu/segment-1.log").read_text()
    assert log.count("TensorBoard curves not written: tensorboard is not installed") == 1, log
    assert not (work / "results/tensorboard").exists()


# releases other than constraints.txt's, as a site's wheelhouse carries its own
OTHER_RELEASES = {"pyyaml": "6.0.3", "numpy": "2.4.5", "tabulate": "0.9.0"}  # the Slurm
# plugin 2.8.0 asks pyyaml >= 6.0.3 and numpy >= 2.4.5
ONLY_THE_WHEELHOUSE = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""}


def is_cuda_stack(name: str) -> bool:
    """torch, torchvision and the CUDA libraries they bring: ~5.5 GB once installed."""
    return name in ("torch", "torchvision", "triton") or name.startswith(("nvidia-", "cuda-"))


# optional wheels a site's wheelhouse may lack (Alliance's lists no optuna-dashboard)
LACKING = ("lightning", "optuna-dashboard")


@pytest.mark.slow  # fetches ~60 MB of wheels from the registry (or pip's cache)
def test_the_cluster_recipe_installs_from_a_wheelhouse_of_other_releases_lacking_optional_wheels(
        tmp_path):
    """docs/install.md's login-node install, `pip install --no-index --upgrade pip`,
    `pip install --no-index -r requirements.txt`, `pip install --no-index --no-deps -e .` and
    `cifarflow install-optional --no-index`, with --find-links to a wheelhouse made here
    whose pyyaml, numpy and tabulate are other releases than constraints.txt's and which
    lacks lightning and optuna-dashboard (and what only they need), pip's configuration out
    of the way: requirements.txt's ranges resolve to what the wheelhouse holds (all of the
    list at once, optional ones included, would not), install-optional names the two
    missing and installs the rest, `snakemake -n` plans a cpu run whose job venvs
    (env.mode slurm_tmpdir) ask for the wheelhouse's releases and no lightning, which the
    plan's wheelhouse check accepts, and refuses a lightning run naming the package.
    torch, torchvision and their CUDA libraries are linked into the new venv from this one
    first (5.5 GB installed; the Slurm test of slurm_tmpdir installs them for real)."""
    everything = requirements_in(ROOT / "requirements.txt") + \
        requirements_in(ROOT / "requirements-optional.txt")
    closure = installed_closure([r for r in everything if r.name not in LACKING])
    assert not set(LACKING) & set(closure) and "lightning-utilities" not in closure
    wanted = {name: OTHER_RELEASES.get(name, dist.version) for name, dist in closure.items()}
    wanted["setuptools"] = version("setuptools")  # pip's build isolation builds the project
    wanted["pip"] = version("pip")  # the recipe's first step upgrades the venv's own
    wheelhouse = build_wheelhouse([f"{n}=={v}" for n, v in sorted(wanted.items())],
                                  tmp_path / "wheelhouse")
    python = venv_of({n: d for n, d in closure.items() if is_cuda_stack(n)}, tmp_path / "venv")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index",
           "--find-links", wheelhouse]
    run([*pip, "--upgrade", "pip"], env=ONLY_THE_WHEELHOUSE)
    at_once = subprocess.run([*pip, "--dry-run", "-r", ROOT / "requirements.txt", "-r",
                              ROOT / "requirements-optional.txt"], capture_output=True,
                             text=True, env={**os.environ, **ONLY_THE_WHEELHOUSE}, timeout=600)
    assert at_once.returncode != 0 and "No matching distribution found for" in at_once.stderr
    run([*pip, "-r", ROOT / "requirements.txt"], env=ONLY_THE_WHEELHOUSE, timeout=600)
    run([*pip, "--no-deps", "-e", project_copy(tmp_path)], env=ONLY_THE_WHEELHOUSE)
    got = run([python, "-c", "from importlib.metadata import version as v; "
               "print(*(v(n) for n in ('pyyaml', 'numpy', 'tabulate')))"]).stdout.split()
    assert got == list(OTHER_RELEASES.values())

    bin_dir = python.parent
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "VIRTUAL_ENV": str(python.parent.parent),
           **ONLY_THE_WHEELHOUSE}
    said = run(["cifarflow", "install-optional", "--no-index", "--find-links", wheelhouse],
               env=env, timeout=600).stdout
    for name in LACKING:
        assert re.search(rf"^MISSING {name}\S* \(.*No matching distribution", said, re.M), said
    for name in ("tensorboard", "nvidia-ml-py"):
        assert re.search(rf"^installed {name}\S*: ", said, re.M), said
    assert "2 optional package(s) not installed" in said
    got = run([python, "-c", "from importlib.metadata import version as v; "
               "print(*(v(n) for n in ('pyyaml', 'numpy', 'tensorboard')))"]).stdout.split()
    assert got == [*list(OTHER_RELEASES.values())[:2], version("tensorboard")]  # none changed

    job_venvs = tmp_path / "job_venvs.yaml"
    job_venvs.write_text(f"env: {{mode: slurm_tmpdir, find_links: {wheelhouse}}}\n")
    work = tmp_path / "work"
    smk = ["snakemake", "-s", ROOT / "Snakefile", "--directory", work, "-n", "--configfile",
           ROOT / "tests/configs/local/config.yaml", job_venvs]
    out = run(smk, env=env, timeout=300)
    assert "holds every job requirement" in out.stdout + out.stderr
    assert "train_cpu" in out.stdout  # planned: its segments are jobs
    pins = (work / "results/environment/job-requirements.txt").read_text()
    assert "\nnumpy==2.4.5\n" in pins and "\npyyaml==6.0.3\n" in pins
    assert "tabulate" not in pins  # the login node's, not the training's
    assert "lightning" not in pins and "\ntensorboard==" in pins  # a cpu run, with curves
    refused = subprocess.run([*map(str, smk), "--config", "strategies=[lightning]"],
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, **env})
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "strategy lightning (config strategies): it needs " \
        "lightning>=2.0,<3" in text, text[-3000:]
    assert "Traceback" not in text
