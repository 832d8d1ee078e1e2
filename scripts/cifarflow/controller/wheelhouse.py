"""What a job venv (env.mode slurm_tmpdir) installs, and whether the wheelhouse holds it.

The login node's venv was resolved from the cluster's wheelhouse (requirements.txt holds
version ranges). A job venv asks the same wheelhouse for exactly the versions the login
node got: the closure of what the plan's training processes import (no lightning without a
lightning run, no TensorBoard where no curves are written), as installed here. At `snakemake
-n`, pip's own resolver checks that the wheelhouse holds them (a dry run, nothing is
installed), so a plan that would fail in every job's prologue is refused before one job is
queued. Runs in the main Snakemake process only. No torch here."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ..engine.checkpoints.files import atomic_write_text

# what every training process imports (engine, strategies, environment record), top-level:
# requirements.txt holds their ranges; no Snakemake, pandas or matplotlib in a job venv
CORE_STACK = ("torch", "torchvision", "numpy", "pyyaml")
GPU_SAMPLER = "nvidia-ml-py"  # GPU utilisation, sampled where a run trains on GPUs
CURVES = "tensorboard"  # TensorBoard event files, where a run writes them (train.tensorboard)
JOB_REQUIREMENTS = "environment/job-requirements.txt"  # under results/: written per plan
CHECKS = "environment/wheelhouse-checks.json"  # under results/: the digests pip accepted
MAX_ROUNDS = 20  # pip names one missing distribution per try: the most one check names
PIP_TIMEOUT_S = 300


class WheelhouseError(Exception):
    """The job venvs could not be built from the wheelhouse: what is missing, the way out."""


def training_stack(runs) -> tuple[str, ...]:
    """What the plan's runs import: the core, each strategy's own packages (lightning's),
    the GPU sampler where a run trains on GPUs, TensorBoard where a run writes curves."""
    extra: set[str] = set()
    for run in runs:
        extra.update(run.strategy_class.packages)
        if run.strategy_class.gpus_per_node(run.config):
            extra.add(GPU_SAMPLER)
        if run.config.tensorboard:
            extra.add(CURVES)
    return CORE_STACK + tuple(sorted(extra))


def installed_closure(roots, distribution=metadata.distribution) -> dict:
    """name -> installed Distribution of these requirements (names, or requirement strings with
    extras) and of everything they require here, markers evaluated for this Python and the
    extras asked. A distribution not installed here is left out (an optional one)."""
    todo, seen, found = [Requirement(str(r)) for r in roots], set(), {}
    while todo:
        wanted = todo.pop()
        name = canonicalize_name(wanted.name)
        key = (name, tuple(sorted(wanted.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": extra})
                                         for extra in ("", *wanted.extras)):
                todo.append(req)
    return found


def job_requirements(closure: dict) -> str:
    """The job venv's requirements file: every distribution of the closure (installed_closure)
    at the version the login node installed from the wheelhouse."""
    lines = [f"{name}=={dist.version}" for name, dist in sorted(closure.items())]
    return ("# Written by the workflow at each plan (cifarflow/controller/wheelhouse.py): what a training\n"
            "# process imports, at the versions the login node installed from the wheelhouse.\n"
            "# env.mode slurm_tmpdir installs exactly this in every job. Do not edit: name your\n"
            "# own file in env.requirements instead.\n" + "\n".join(lines) + "\n")


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` unless the file holds it already (its time stamp then keeps saying
    when it last changed); True if written."""
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return True


def check_digest(requirements: str, index_args: list[str], python: str,
                 environ=os.environ) -> str:
    """What decides pip's answer: the requirements, the index options, the Python, pip's
    configuration (PIP_* and its config files) and the wheels a --find-links folder holds."""
    parts = [requirements, json.dumps(index_args), python, sys.version]
    parts += [f"{k}={v}" for k, v in sorted(environ.items()) if k.startswith("PIP_")]
    for i, arg in enumerate(index_args[:-1]):
        if arg == "--find-links" and Path(index_args[i + 1]).is_dir():
            parts += sorted(os.listdir(index_args[i + 1]))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


MISSING = re.compile(r"No matching distribution found for (\S+)")
VERSIONS = re.compile(r"Could not find a version that satisfies the requirement (\S+) "
                      r"\(from versions: ([^)]*)\)")


def missing_in_wheelhouse(requirements: list[str], index_args: list[str], python: str,
                          run=subprocess.run) -> list[str]:
    """Requirements the wheelhouse cannot give, each with the versions it holds ("pyyaml==6.0.4
    (the wheelhouse has 6.0.1, 6.0.2)"); [] when pip resolves them all. pip stops at the
    first it cannot find: that one is set aside and pip asked again, up to MAX_ROUNDS."""
    left, missing = list(requirements), []
    for _ in range(MAX_ROUNDS):
        if not left:
            break
        with tempfile.TemporaryDirectory(prefix="cifarflow-wheelhouse-") as tmp:
            listed = Path(tmp, "requirements.txt")
            listed.write_text("\n".join(left) + "\n")
            out = run([python, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                       "--quiet", "--disable-pip-version-check", "--report",
                       str(Path(tmp, "report.json")), *index_args, "-r", str(listed)],
                      capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if out.returncode == 0:
            break
        found = MISSING.search(out.stderr)
        line = found and next((r for r in left if canonicalize_name(Requirement(r).name)
                               == canonicalize_name(Requirement(found[1]).name)), None)
        if not line:  # not a missing distribution: pip's own words
            tail = "\n".join(out.stderr.strip().splitlines()[-8:])
            raise WheelhouseError(f"pip could not resolve the job requirements:\n{tail}")
        held = VERSIONS.search(out.stderr)
        versions = held[2].strip() if held else ""
        missing.append(f"{line} (the wheelhouse has {versions or 'no version of it'})")
        left.remove(line)
    else:
        missing.append(f"maybe more: pip was asked {MAX_ROUNDS} times")
    return missing


def check_wheelhouse(requirements: Path, index_args: list[str], checks: Path,
                     python: str = sys.executable, run=subprocess.run,
                     environ=os.environ) -> bool:
    """Raise WheelhouseError naming what the job venvs cannot install; the answer is kept
    per digest (check_digest) in ``checks``, so a plan checked once is not checked again.
    Only a success is kept: a refusal is asked again after the wheelhouse changes. True if
    pip was asked."""
    text = requirements.read_text()
    digest = check_digest(text, index_args, python, environ)
    kept = json.loads(checks.read_text()) if checks.is_file() else {}
    if digest in kept:
        return False
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("-")]
    missing = missing_in_wheelhouse(lines, index_args, python, run)
    if missing:
        where = " ".join(index_args) or "pip's own configuration"
        raise WheelhouseError(
            f"env.mode slurm_tmpdir: the job venvs cannot be built from the wheelhouse "
            f"({where}): {len(missing)} of the {len(lines)} requirements of {requirements} "
            f"are not there: {'; '.join(missing)}. No job was queued. Either install the "
            "login node's venv from the same wheelhouse (pip install --no-index -r "
            "requirements.txt: the job venvs then ask for what it holds), add the wheels to "
            "env.find_links, name a requirements file of versions it holds in "
            "env.requirements, or use env.mode venv with a venv on a shared filesystem")
    kept[digest] = {"requirements": str(requirements), "index": index_args, "python": python}
    write_if_changed(checks, json.dumps(kept, indent=1) + "\n")
    return True
