"""The package's folders say where its code runs (docs/architecture.md), and its imports keep
that picture true: read with `ast` (nothing is imported), every import of a cifarflow module,
at the top of a file, inside a function or through ``importlib.import_module``, goes down the
parts or stays inside one; no modules of one part import each other in a circle; each
part's "Imports:" line names the parts it imports; and the doc's diagram draws those arrows
and no other."""

import ast
import re
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
DYNAMIC = {"import_module", "__import__"}  # importlib.import_module("cifarflow.x"), __import__


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in MAY_IMPORT:
        return parts[1]
    return "door" if len(parts) > 1 and parts[1] in DOOR else "base"


def is_module(name: str) -> bool:
    where = PACKAGE.parent / name.replace(".", "/")
    return where.with_suffix(".py").exists() or where.is_dir()


def dynamic_target(call: ast.Call, module: str) -> str | None:
    """The cifarflow module an ``import_module``/``__import__`` call names: a literal, or the
    literal head of an f-string (``f"{__name__}.{x}"`` counts as this module's own)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name not in DYNAMIC or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        text = arg.value
    elif isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        if isinstance(head, ast.FormattedValue) and getattr(head.value, "id", "") == "__name__":
            return module
        text = head.value if isinstance(head, ast.Constant) else ""
        text = text.rpartition(".")[0]  # the whole names before the formatted part
    else:
        return None
    return text if text.split(".")[0] == "cifarflow" else None


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
                found.append((node.lineno, sub if is_module(sub) else target))
        elif isinstance(node, ast.Call):
            target = dynamic_target(node, module)
            if target:
                found.append((node.lineno, target))
    return found


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def crossings() -> list[str]:
    wrong = []
    for name, path in modules().items():
        mine = part_of(name)
        if mine == "door":
            continue
        for line, target in imported(path):
            theirs = part_of(target)
            if theirs == "door" or theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {target} ({theirs})")
    return wrong


def circles() -> list[list[str]]:
    """Modules of one part that import each other in a loop (a package's import counts as
    its __init__'s), each loop once, from its smallest name."""
    edges = {}
    for name, path in modules().items():
        edges[name] = {t for _, t in imported(path)
                       if t != name and part_of(t) == part_of(name) and t in modules()}
    found = set()

    def walk(start, node, path):
        for nxt in edges.get(node, ()):
            if nxt == start:
                found.add(tuple(path))
            elif nxt not in path and nxt > start:
                walk(start, nxt, path + [nxt])

    for start in sorted(edges):
        walk(start, start, [start])
    return [list(loop) for loop in sorted(found)]


def part_arrows() -> set[tuple[str, str]]:
    """(part, part it imports) of the code, the door's included; the Snakefile's rules
    (workflow/rules/*.smk, which import the package) are the part "snakefile"."""
    arrows = set()
    for name, path in modules().items():
        mine = part_of(name)
        arrows |= {(mine, part_of(t)) for _, t in imported(path) if part_of(t) != mine}
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for target in re.findall(r"^\s*from (cifarflow[\w.]*) import", smk.read_text(), re.M):
            arrows.add(("snakefile", part_of(target)))
    return arrows


def declared(part: str) -> set[str]:
    """The parts a part's __init__ says it imports: those its "Imports:" line names before
    any "never" (``engine``), and "base" for the shared top modules."""
    doc = ast.get_docstring(ast.parse((PACKAGE / part / "__init__.py").read_text())) or ""
    lines = [line for line in doc.splitlines() if line.startswith("Imports:")]
    assert len(lines) == 1, f"{part}/__init__.py: one line starting 'Imports:'"
    said = re.split(r";|\bnever\b", lines[0])[0]
    return set(re.findall(r"``(\w+)``", said)) | ({"base"} if "top modules" in said else set())


def test_no_import_goes_up_the_parts_or_both_ways():
    assert crossings() == []


def test_no_modules_of_one_part_import_each_other_in_a_circle():
    assert circles() == []


def test_every_part_says_what_runs_there_and_what_it_imports():
    arrows = part_arrows()
    for part in MAY_IMPORT:
        if part == "base":
            continue
        actual = {theirs for mine, theirs in arrows if mine == part}
        assert declared(part) == actual, f"{part}/__init__.py's Imports: line"


def test_the_diagram_draws_the_imports_there_are():
    """docs/architecture.md's mermaid diagram: its arrows are the parts' imports (the
    Snakefile's and the door's included), no more, no fewer."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    diagram = doc.split("```mermaid")[1].split("```")[0]
    drawn = {(a, b) for a, b in re.findall(r"^\s*(\w+)(?:\[[^\]]*\])?\s*-->\s*(\w+)", diagram,
                                           re.M)}
    assert drawn == {(a.replace("base", "top"), b.replace("base", "top"))
                     for a, b in part_arrows()}


def test_the_check_sees_an_import_hidden_in_a_function_or_importlib(tmp_path, monkeypatch):
    """The test itself: an upward import inside a function of the engine is found, and one
    through importlib; two engine modules that import each other (one inside a function)
    are a circle."""
    import test_architecture as me

    fake = tmp_path / "cifarflow"
    (fake / "engine").mkdir(parents=True)
    (fake / "job").mkdir()
    (fake / "job" / "tries.py").write_text("")
    (fake / "engine" / "segment.py").write_text("def f():\n    from ..job import tries\n")
    (fake / "engine" / "models.py").write_text(
        "import importlib\nfrom . import build\n"
        "def g():\n    return importlib.import_module('cifarflow.job.tries')\n")
    (fake / "engine" / "build.py").write_text("def h():\n    from .models import g\n")
    monkeypatch.setattr(me, "PACKAGE", fake)
    monkeypatch.setattr(me, "ROOT", tmp_path)
    assert me.crossings() == [
        "cifarflow/engine/models.py:4: engine imports cifarflow.job.tries (job)",
        "cifarflow/engine/segment.py:2: engine imports cifarflow.job.tries (job)"]
    assert me.circles() == [["cifarflow.engine.build", "cifarflow.engine.models"]]


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
