"""The fixes of Snakemake and its Slurm plugin (controller/snakemake_fixes.py,
job/snakemake_start.py) against the real modules of both ends of each range
requirements.txt allows (issue 55): the oldest and the newest release the package index
offers within the range of every package a fix touches are installed, without their
dependencies, into a folder put first on PYTHONPATH (cached under ~/.cache), and the unit
tests of the fixes run against them. A new release that breaks a fix fails here, not in a
user's sweep."""

import functools
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import PY, ROOT
from cifarflow.controller import snakemake_fixes as fixes

FIX_TESTS = ("tests/unit/test_status_checks.py", "tests/unit/test_submit_room.py")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cifarflow-tests"


def ranges() -> dict[str, Requirement]:
    """requirements.txt's requirement of every package a fix touches."""
    touched = {t[3] for t in fixes.TARGETS}
    found = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            if req.name in touched:
                found[req.name] = req
    assert set(found) == touched, f"requirements.txt lists no range for {touched - set(found)}"
    return found


@functools.cache
def releases(package: str) -> list[Version]:
    """Every release of ``package`` the package index offers (pip's own index settings)."""
    for attempt in range(3):  # the index may not answer at once
        out = subprocess.run([PY, "-m", "pip", "index", "versions", package,
                              "--disable-pip-version-check"], capture_output=True, text=True,
                             timeout=300)
        listed = re.search(r"^Available versions: (.+)$", out.stdout, flags=re.M)
        if listed:
            break
        time.sleep(5 * (attempt + 1))
    assert out.returncode == 0 and listed, f"pip index versions {package}: {out.stderr}"
    return [Version(v) for v in listed.group(1).split(", ")]


def range_end(end: str) -> dict[str, str]:
    """The oldest or the newest allowed release of each package, as the index offers them."""
    chosen = {}
    for name, req in ranges().items():
        allowed = sorted(v for v in releases(name) if v in req.specifier and not v.is_prerelease)
        assert allowed, f"the package index offers no {name} within {req.specifier}"
        chosen[name] = str(allowed[0] if end == "oldest" else allowed[-1])
    return chosen


def installed_apart(pins: dict[str, str]) -> Path:
    """A folder holding exactly these releases (no dependencies: the venv has them), built
    once per set of releases."""
    key = "-".join(f"{name}=={pins[name]}" for name in sorted(pins))
    folder = CACHE / "fix-ranges" / re.sub(r"[^A-Za-z0-9.=_-]", "_", key)
    if not (folder / "done").exists():
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([PY, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--target", str(partial),
                        *(f"{n}=={v}" for n, v in pins.items())], check=True, timeout=600)
        (partial / "done").write_text(json.dumps(pins))
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


@pytest.mark.parametrize("end", ["oldest", "newest"])
def test_the_fixes_apply_to_both_ends_of_each_allowed_range(end, tmp_path):
    pins = range_end(end)
    folder = installed_apart(pins)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(ROOT / "scripts")]))
    seen = subprocess.run(
        [PY, "-c", "import json, sys, importlib.metadata as m; "
                   "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))", *pins],
        env=env, capture_output=True, text=True, check=True)
    assert json.loads(seen.stdout) == pins  # the modules under test are that end's
    tests = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            f"--basetemp={tmp_path / 'pytest'}", *FIX_TESTS],  # its own tmp
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0, (pins, tests.stdout[-4000:], tests.stderr[-2000:])
    assert re.search(r"\d+ passed", tests.stdout) and "skipped" not in tests.stdout
