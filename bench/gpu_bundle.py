"""The pure-Python packages bench/gpu_check.py needs beside torch, carried with the
repository so the GPU machine installs nothing (it often reaches no package index):
pytest and what it imports (pluggy, iniconfig, packaging, pygments, and the backports
older Pythons need), and nvidia-ml-py (NVML: GPU utilisation; optional).

    make gpu-bundle                                # where pip reaches an index
    python3 bench/gpu_bundle.py --from-installed   # copies of this Python's installed ones

The bundle is bench/gpu_bundle/ (ignored by git): site/ holds the packages, unpacked as
pip would install them; bundle.json says what is in it and how it was made. gpu_check puts
site/ first on its sys.path and its cases' PYTHONPATH (``activate``)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

BENCH = Path(__file__).resolve().parent
DEFAULT = BENCH / "gpu_bundle"
WANTED = ["pytest", "nvidia-ml-py"]
# pytest needs these below Python 3.11; pip resolves markers for the Python it runs on, so
# they are asked for by name (on 3.11 and later pytest does not import them)
BACKPORTS = ["exceptiongroup", "tomli"]


def activate(bundle: Path) -> Path | None:
    """The bundle's site/ first on sys.path; its path, or None where there is no bundle."""
    site = Path(bundle) / "site"
    if not site.is_dir():
        return None
    sys.path.insert(0, str(site))
    return site


def where(module: str) -> str | None:
    """Where ``module`` would be imported from (a bundle or the environment), or None."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    return spec.origin if spec and spec.origin else None


def unpack_wheel(wheel: Path, site: Path) -> None:
    """A pure-Python wheel unpacked as pip installs it: its files at the top of site/, the
    purelib part of its .data folder too (scripts and headers are not needed)."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                target = site.joinpath(*parts[2:])
            else:
                target = site / name
            if name.endswith("/"):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))


def from_index(site: Path, constraints: Path | None) -> dict:
    """pip downloads pure-Python wheels (any platform) of WANTED, BACKPORTS and what they
    require, each unpacked into site/."""
    wheels = site.parent / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels),
           "--only-binary=:all:", "--platform", "any", "--implementation", "py", "--abi", "none",
           *WANTED, *BACKPORTS]
    if constraints and constraints.is_file():
        cmd += ["-c", str(constraints)]
    subprocess.run(cmd, check=True)
    got = {}
    for wheel in sorted(wheels.glob("*.whl")):
        unpack_wheel(wheel, site)
        name, version = wheel.name.split("-")[:2]
        got[name] = version
    return got


def requirement_names(dist: metadata.Distribution) -> list[str]:
    """The distributions ``dist`` requires on this Python (extras left out)."""
    from packaging.requirements import Requirement

    names = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.append(req.name)
    return names


def from_installed(site: Path) -> dict:
    """Copies of this Python's installed WANTED and what they require on it: no network.
    A bundle for this Python's version (BACKPORTS only where it installed them)."""
    todo, got = list(WANTED), {}
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in got:
            continue
        dist = metadata.distribution(name)
        got[key] = dist.version
        for f in dist.files or []:
            if f.parts[0] == ".." or f.suffix == ".pyc":
                continue  # console scripts; byte code is made where it runs
            target = site / f
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dist.locate_file(f), target)
        todo += requirement_names(dist)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=DEFAULT)
    ap.add_argument("--from-installed", action="store_true",
                    help="copy this Python's installed packages instead of downloading")
    ap.add_argument("--constraints", type=Path, default=BENCH.parent / "constraints.txt",
                    help="versions to download at (the project's constraints.txt)")
    a = ap.parse_args()
    site = a.dest / "site"
    shutil.rmtree(a.dest, ignore_errors=True)
    site.mkdir(parents=True)
    got = from_installed(site) if a.from_installed else from_index(site, a.constraints)
    made = ("copies of the packages installed for Python "
            f"{sys.version_info.major}.{sys.version_info.minor}" if a.from_installed
            else "pure-Python wheels from the package index")
    (a.dest / "bundle.json").write_text(json.dumps(
        {"made_from": made, "distributions": got}, indent=1) + "\n")
    print(f"{a.dest}: {', '.join(f'{k} {v}' for k, v in sorted(got.items()))} ({made})")


if __name__ == "__main__":
    main()
