"""`make lint` accepts snakemake's "no conda/container" finding and nothing else."""

import subprocess
import sys

from conftest import ENV, ROOT

LINT = ROOT / "tests" / "lint_workflow.py"


def lint(directory, rule_body: str) -> subprocess.CompletedProcess:
    (directory / "Snakefile").write_text(f"rule write_note:\n{rule_body}")
    return subprocess.run([sys.executable, str(LINT), "--snakefile", str(directory / "Snakefile"),
                           "--directory", str(directory)], env=ENV, capture_output=True,
                          text=True, timeout=300)


def test_a_rule_without_conda_or_container_passes(tmp_path):
    out = lint(tmp_path, '    output:\n        "note.txt",\n    log:\n        "note.log",\n'
                         '    shell:\n        "echo note > {output} 2> {log}"\n')
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 rule(s) without conda/container (accepted" in out.stdout
    assert "0 other finding(s)" in out.stdout


def test_any_other_finding_fails_and_is_named(tmp_path):
    out = lint(tmp_path,
               '    output:\n        "note.txt",\n    shell:\n        "echo note > {output}"\n')
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{tmp_path / 'Snakefile'}:1 rule write_note: No log directive defined" in out.stdout
    assert "1 other finding(s)" in out.stdout
