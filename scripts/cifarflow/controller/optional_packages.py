"""The optional packages (requirements-optional.txt): what each is for, installing them one
by one so a wheelhouse lacking one leaves only its feature out (`cifarflow
install-optional`), and whether an environment holds one (a plan whose runs need a missing
one is refused). Runs on the login node. No torch."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

OPTIONAL_LIST = Path(__file__).resolve().parents[3] / "requirements-optional.txt"


@dataclass(frozen=True)
class OptionalPackage:
    requirement: str  # as requirements-optional.txt gives it: name and version range
    purpose: str      # its comment: what it is for

    @property
    def name(self) -> str:
        return canonicalize_name(Requirement(self.requirement).name)


def read_optional(path: Path = OPTIONAL_LIST) -> list[OptionalPackage]:
    """requirements-optional.txt's requirements, each with the comment after it."""
    found = []
    for line in Path(path).read_text().splitlines():
        requirement, _, purpose = line.partition("#")
        if requirement.strip():
            found.append(OptionalPackage(requirement.strip(), purpose.strip()))
    return found


def optional_package(name: str, path: Path = OPTIONAL_LIST) -> OptionalPackage:
    return next(p for p in read_optional(path) if p.name == canonicalize_name(name))


def site_dirs(prefix) -> list[str]:
    """The site-packages folders of the environment at ``prefix`` (a venv)."""
    return [str(p) for p in Path(prefix).glob("lib/python*/site-packages")]


def is_installed(name: str, prefix=None) -> bool:
    """Whether this environment (or the venv at ``prefix``) holds distribution ``name``."""
    path = sys.path if prefix is None else site_dirs(prefix)
    return any(True for _ in metadata.distributions(name=name, path=path))


def not_installed(name: str, prefix=None) -> str:
    """"" where the environment (this one, or the venv at ``prefix``) holds optional package
    ``name``; else what it lacks and how to install it, to end an error line."""
    if is_installed(name, prefix):
        return ""
    package = optional_package(name)
    where = f"the venv {prefix}" if prefix else f"this environment ({sys.prefix})"
    return (f"it needs {package.requirement} ({package.purpose}), which {where} lacks: "
            f"install it with `cifarflow install-optional --no-index` (requirements-optional.txt"
            f", docs/install.md) or `pip install --no-index '{package.requirement}'`")


def installed_pins() -> str:
    """Constraints holding every distribution of this environment at its version: an
    optional package may add what it needs, never change what the controller has."""
    pins: dict[str, str] = {}
    for dist in metadata.distributions():  # sys.path's order: the one imported comes first
        if dist.metadata["Name"]:
            pins.setdefault(canonicalize_name(dist.metadata["Name"]), dist.version)
    return "".join(f"{name}=={v}\n" for name, v in sorted(pins.items()))


def install_optional(pip_args: list[str], path: Path = OPTIONAL_LIST,
                     python: str = sys.executable, run=subprocess.run, say=print) -> list:
    """`pip install` each optional package alone, with ``pip_args`` (--no-index, --find-links)
    and this environment's versions as constraints; say what each is for and whether it
    came. The ones pip could not install, with pip's last line."""
    missing = []
    with tempfile.TemporaryDirectory(prefix="cifarflow-optional-") as tmp:
        pins = Path(tmp, "installed.txt")
        pins.write_text(installed_pins())
        for package in read_optional(path):
            out = run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                       *pip_args, "-c", str(pins), package.requirement],
                      capture_output=True, text=True)
            if out.returncode == 0:
                say(f"installed {package.requirement}: {package.purpose}")
                continue
            why = (out.stderr.strip().splitlines() or ["pip failed"])[-1]
            missing.append((package, why))
            say(f"MISSING {package.requirement} ({why}): {package.purpose}")
    if missing:
        say(f"{len(missing)} optional package(s) not installed, the rest of the workflow works "
            f"without them: {', '.join(p.name for p, _ in missing)}. Add their wheels to a "
            "folder and run again with --find-links FOLDER, or go without those features")
    else:
        say("every optional package is installed")
    return missing
