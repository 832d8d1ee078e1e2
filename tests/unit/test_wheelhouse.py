"""The job venvs' requirements (the login node's own versions of the training stack) and
the check, at plan time, that the wheelhouse holds them: pip's real resolver, a real
wheelhouse of small wheels, no network."""

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from conftest import ROOT, probe_wheel
from cifarflow.job.job_env import pip_index_args
from cifarflow.controller.optional_packages import read_optional
from cifarflow.controller.wheelhouse import (CORE_STACK, CURVES, GPU_SAMPLER, WheelhouseError,
                                             check_wheelhouse, installed_closure,
                                             job_requirements, missing_in_wheelhouse)



class FakeDist:
    def __init__(self, version, requires=()):
        self.version, self.requires = version, list(requires)


def test_the_closure_follows_markers_extras_and_skips_what_is_not_installed():
    dists = {"torch": FakeDist("2.6.0+computecanada", ["filelock", "sympy>=1.13",
                                                        'triton; platform_system == "Nowhere"']),
             "filelock": FakeDist("3.12.0"), "sympy": FakeDist("1.13.1", ["mpmath"]),
             "mpmath": FakeDist("1.3.0"), "triton": FakeDist("3.0"),
             "lightning": FakeDist("2.4.0", ['fsspec[http]>=2022', 'torch',
                                             'rich; extra == "extra"']),
             "fsspec": FakeDist("2024.1.0", ['aiohttp; extra == "http"']),
             "aiohttp": FakeDist("3.9.0"), "rich": FakeDist("13.0")}

    def distribution(name):
        if name not in dists:
            raise metadata.PackageNotFoundError(name)
        return dists[name]

    closure = installed_closure(["torch", "lightning", "nvidia-ml-py"], distribution)
    assert {name: dist.version for name, dist in closure.items()} == {"torch": "2.6.0+computecanada", "filelock": "3.12.0", "sympy": "1.13.1",
                       "mpmath": "1.3.0", "lightning": "2.4.0", "fsspec": "2024.1.0",
                       "aiohttp": "3.9.0"}  # triton's marker is false, rich is an extra
    text = job_requirements(closure)
    assert "torch==2.6.0+computecanada\n" in text  # the site's own build, as installed
    assert [line for line in text.splitlines() if not line.startswith("#")][:2] == \
        ["aiohttp==3.9.0", "filelock==3.12.0"]


def test_the_core_stack_is_what_requirements_txt_lists_first_and_this_venv_holds_it():
    listed = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text()
              .splitlines()]
    names = [line.split(">")[0].split("<")[0].split("=")[0].split("[")[0]
             for line in listed if line]
    assert names[:len(CORE_STACK)] == list(CORE_STACK)
    # what some runs add is optional, each with what it is for
    optional = {p.name: p.purpose for p in read_optional()}
    assert {"lightning", CURVES, GPU_SAMPLER} <= set(optional) and all(optional.values())
    assert not set(optional) & set(names)
    closure = installed_closure(CORE_STACK + ("lightning", CURVES, GPU_SAMPLER))
    assert set(CORE_STACK) <= set(closure)
    assert closure["torch"].version == metadata.version("torch")
    # the controller's own packages stay out of the job venvs
    assert not {"snakemake", "pandas", "matplotlib", "tabulate", "pytest"} & set(closure)


def test_index_options():
    env = {"pip_no_index": True, "find_links": ""}
    assert pip_index_args(env) == ["--no-index"]
    assert pip_index_args({**env, "find_links": "/w h"}) == ["--no-index", "--find-links", "/w h"]
    assert pip_index_args({**env, "pip_no_index": False}) == []


@pytest.fixture
def wheelhouse(tmp_path):
    for version in ("0.1", "0.2"):
        probe_wheel(tmp_path / "wheels", version=version)
    probe_wheel(tmp_path / "wheels", name="cifarflow-other", version="1.0")
    return tmp_path / "wheels"


def pip_env(monkeypatch):
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)


def test_pip_names_every_missing_distribution_with_the_versions_the_wheelhouse_has(
        wheelhouse, monkeypatch):
    pip_env(monkeypatch)
    index = ["--no-index", "--find-links", str(wheelhouse)]
    assert missing_in_wheelhouse(["cifarflow-probe==0.2", "cifarflow-other==1.0"], index,
                                 sys.executable) == []
    missing = missing_in_wheelhouse(["cifarflow-probe==0.3", "cifarflow-other==1.0",
                                     "cifarflow-absent==2.0"], index, sys.executable)
    assert missing == ["cifarflow-probe==0.3 (the wheelhouse has 0.1, 0.2)",
                       "cifarflow-absent==2.0 (the wheelhouse has none)"]


def test_a_check_refuses_with_the_way_out_and_keeps_only_successes(wheelhouse, tmp_path,
                                                                   monkeypatch):
    pip_env(monkeypatch)
    index = ["--no-index", "--find-links", str(wheelhouse)]
    req, checks = tmp_path / "job-requirements.txt", tmp_path / "checks.json"
    req.write_text("# derived\ncifarflow-probe==0.3\n")
    with pytest.raises(WheelhouseError) as refused:
        check_wheelhouse(req, index, checks)
    text = str(refused.value)
    assert "1 of the 1 requirements" in text and "cifarflow-probe==0.3 (the wheelhouse has " \
        "0.1, 0.2)" in text and "env.find_links" in text and "No job was queued" in text
    assert not checks.exists()  # a refusal is asked again

    req.write_text("cifarflow-probe==0.2\ncifarflow-other==1.0\n")
    assert check_wheelhouse(req, index, checks) is True
    assert len(json.loads(checks.read_text())) == 1

    def no_pip(*args, **kw):
        raise AssertionError("pip was asked again for a digest it accepted")

    assert check_wheelhouse(req, index, checks, run=no_pip) is False  # kept: no pip
    probe_wheel(wheelhouse, version="0.4")  # the wheelhouse changed: asked again
    assert check_wheelhouse(req, index, checks) is True
    req.write_text("cifarflow-probe==0.4\n")  # new requirements: asked again
    assert check_wheelhouse(req, index, checks) is True
    assert len(json.loads(checks.read_text())) == 3


def test_what_is_not_a_missing_distribution_is_pip_s_own_words(tmp_path):
    req = tmp_path / "r.txt"
    req.write_text("cifarflow-probe==0.1\n")
    broken = subprocess.CompletedProcess([], 1, "", "ERROR: some resolver trouble\nline two\n")
    with pytest.raises(WheelhouseError, match="(?s)could not resolve.*some resolver trouble"):
        check_wheelhouse(req, [], tmp_path / "c.json", run=lambda *a, **k: broken)
