"""The package's folders say where its code runs (docs/architecture.md), and its imports keep
that picture true: read with `ast` (nothing is imported), every import of a cifarflow module,
at the top of a file or inside a function, goes down the parts or stays inside one."""

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "scripts" / "cifarflow"
DOOR = {"cli", "__main__"}  # the command: it dispatches to every part
# each part, and the parts it may import (the shared top modules are "base")
MAY_IMPORT = {
    "base": {"base"},
    "engine": {"base", "engine"},
    "job": {"base", "engine", "job"},
    "results": {"base", "engine", "job", "results"},
    "controller": {"base", "engine", "job", "results", "controller"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in MAY_IMPORT:
        return parts[1]
    return "door" if len(parts) > 1 and parts[1] in DOOR else "base"


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, cifarflow module) of every import in the file, relative ones resolved."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("cifarflow")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("cifarflow"):
                target = node.module
            else:
                continue
            for alias in node.names:  # `from . import slurm` names a module
                sub = f"{target}.{alias.name}"
                is_module = (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() or \
                    (PACKAGE.parent / sub.replace(".", "/")).is_dir()
                found.append((node.lineno, sub if is_module else target))
    return found


def crossings() -> list[str]:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = part_of(module_name(path))
        if mine == "door":
            continue
        for line, target in imported(path):
            theirs = part_of(target)
            if theirs == "door" or theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {target} ({theirs})")
    return wrong


def test_no_import_goes_up_the_parts_or_both_ways():
    assert crossings() == []


def test_every_part_says_what_runs_there_and_what_it_may_import():
    for part in MAY_IMPORT:
        if part == "base":
            continue
        doc = ast.get_docstring(ast.parse((PACKAGE / part / "__init__.py").read_text()))
        assert doc and "Imports:" in doc, part


def test_the_check_sees_an_import_hidden_in_a_function(tmp_path, monkeypatch):
    """The test itself: an upward import inside a function of the engine is found."""
    import test_architecture as me

    fake = tmp_path / "cifarflow"
    (fake / "engine").mkdir(parents=True)
    (fake / "job").mkdir()
    (fake / "job" / "tries.py").write_text("")
    (fake / "engine" / "segment.py").write_text("def f():\n    from ..job import tries\n")
    monkeypatch.setattr(me, "PACKAGE", fake)
    monkeypatch.setattr(me, "ROOT", tmp_path)
    assert me.crossings() == ["cifarflow/engine/segment.py:2: engine imports cifarflow.job.tries (job)"]


def test_what_runs_beside_the_training_imports_no_torch():
    """The controller (the login node, and every job's own Snakemake at parse time), the
    job's machinery and the results import no torch: under a site's per-process memory
    accounting a job's Snakemake that imported it was killed before its training began
    (1.23 GB over a 1 GB request, seen on the test cluster when engine/__init__ re-exported
    the segment)."""
    import subprocess
    import sys

    modules = ["cifarflow.controller.workflow", "cifarflow.job.pack", "cifarflow.job.launch",
               "cifarflow.job.takeover", "cifarflow.results.aggregate", "cifarflow.results.show",
               "cifarflow.jobfacts", "cifarflow.cli"]
    probe = (f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); "
             + "; ".join(f"import {m}" for m in modules)
             + "; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
