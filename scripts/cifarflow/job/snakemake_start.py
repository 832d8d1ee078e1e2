"""How a Slurm job's Snakemake starts: ``python snakemake_start.py -m snakemake ARGS`` is
``python -m snakemake ARGS`` without the question the Slurm executor plugin asks slurmctld
while Snakemake reads its command line.

snakemake-executor-plugin-slurm (seen with 2.8) runs ``scontrol show config`` when it is
imported (its MinJobAge, for the help text of ``--slurm-status-command``), and Snakemake
imports every installed executor plugin to build its command line. A job starts two
Snakemakes (the plugin's jobstep, and the one it runs the rule in), so each job asked the
controller twice, two RPCs each (the configuration and a ping): 4 of a pack job's ~15 RPCs
(issue 47). A job's Snakemake never reads that answer: it runs the slurm-jobstep executor.
Here the plugin's module that asks is loaded first, with MinJobAge "unknown" (None: what
the plugin itself answers where scontrol fails), its efficiency report (pandas) at first
use, and the jobstep's command for the rule starts through this file too. Where the
plugin's layout differs (a release without the module or the function), the job stops
with an error naming the package, its release and the way out, as
controller/snakemake_fixes.py does: a fix never stops applying without a word.

The controller puts this file in the jobs' command (controller/snakemake_fixes.py,
start_jobs_quietly). It runs as a script, before the engine is on sys.path: it imports
nothing of cifarflow.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # run by path: its folder first on sys.path, as `-m` has the cwd
    sys.path[0] = os.getcwd()

import importlib.util  # noqa: E402
import runpy  # noqa: E402
import shlex  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

PLUGIN, PACKAGE = "snakemake_executor_plugin_slurm", "snakemake-executor-plugin-slurm"
ASKING_MODULE = f"{PLUGIN}.job_status_query"  # its get_min_job_age runs scontrol show config


def command(python: str = sys.executable) -> str:
    """What starts a job's Snakemake in place of ``python``, before ``-m snakemake``."""
    return f"{shlex.quote(python)} {shlex.quote(str(Path(__file__).resolve()))}"


def layout_changed(what: str, package: str) -> RuntimeError:
    """The error of a fix whose target this release lacks (snakemake_fixes.missing's words)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version(package)
    except PackageNotFoundError:
        release = "(not installed)"
    return RuntimeError(f"cifarflow cannot apply its fix to {package} {release}: {what} is not "
                        "there. Install the release constraints.txt pins (pip install -c "
                        "constraints.txt ...), or report this")


def plugin_module_file(module: str) -> Path | None:
    """Where the plugin's ``module`` is, found without running the plugin; None where the
    plugin is not installed or ``module`` is already loaded (nothing to change); an error
    where the plugin is laid out otherwise."""
    if module in sys.modules:
        return None
    spec = importlib.util.find_spec(PLUGIN)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / f"{module.rpartition('.')[2]}.py"
    if not path.is_file():
        raise layout_changed(module, PACKAGE)
    return path


def loaded(module: str, path: Path):
    spec = importlib.util.spec_from_file_location(module, path)
    found = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(found)
    return found


def answer_min_job_age_unknown() -> bool:
    """The plugin's status-query module, loaded before the plugin, its MinJobAge None; False
    where there is nothing to change (plugin_module_file)."""
    path = plugin_module_file(ASKING_MODULE)
    if path is None:
        return False
    module = loaded(ASKING_MODULE, path)
    if not callable(getattr(module, "get_min_job_age", None)):
        raise layout_changed(f"{ASKING_MODULE}.get_min_job_age", PACKAGE)
    module.get_min_job_age = lambda: None
    sys.modules[ASKING_MODULE] = module  # the plugin's `from .job_status_query import` finds it
    return True


REPORT_MODULE = f"{PLUGIN}.efficiency_report"  # imports pandas and numpy at its top


def efficiency_report_on_first_use() -> bool:
    """The plugin's efficiency-report module (the controller writes that report, never a
    job), loaded at its first use instead of with the plugin: it imports pandas, about
    0.45 s of CPU at each of a job's two Snakemake starts (2.4 s, 1.95 s without it, on 2
    cores). False where there is nothing to change (plugin_module_file)."""
    path = plugin_module_file(REPORT_MODULE)
    if path is None:
        return False

    def create_efficiency_report(*args, **kwargs):
        sys.modules[REPORT_MODULE] = real = loaded(REPORT_MODULE, path)
        return real.create_efficiency_report(*args, **kwargs)

    stand_in = types.ModuleType(REPORT_MODULE, "loads the plugin's module at first use")
    stand_in.create_efficiency_report = create_efficiency_report
    sys.modules[REPORT_MODULE] = stand_in  # the plugin's `from .efficiency_report import`
    return True


def start_through_this_file(executor: type) -> None:
    """``executor``'s command for a job's Snakemake (the Slurm plugin's, in the controller;
    the jobstep's for the rule, in a job) starts it through this file, where the job runs
    this very Python (a shared software deployment); else the command is the executor's."""
    original = getattr(executor, "get_python_executable", None)
    if original is None:
        raise layout_changed(f"{executor.__module__}.{executor.__name__}.get_python_executable",
                             "snakemake-interface-executor-plugins")
    if getattr(original, "through_snakemake_start", False):
        return

    def get_python_executable(self):
        python = original(self)
        return command(python) if python == sys.executable else python

    get_python_executable.through_snakemake_start = True
    executor.get_python_executable = get_python_executable


def start_rule_quietly() -> None:
    """The jobstep's command for the rule (the job's second Snakemake) starts here too."""
    try:
        import snakemake_executor_plugin_slurm_jobstep as jobstep
    except ImportError:
        return
    start_through_this_file(jobstep.Executor)


def main(argv: list[str]) -> None:
    if argv[:2] != ["-m", "snakemake"]:
        sys.exit(f"usage: {Path(__file__).name} -m snakemake ARGS (the job's Snakemake); "
                 f"got {' '.join(argv[:2]) or 'nothing'}")
    answer_min_job_age_unknown()
    efficiency_report_on_first_use()
    start_rule_quietly()
    sys.argv = [sys.argv[0], *argv[2:]]
    runpy.run_module("snakemake", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
