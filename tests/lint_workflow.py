"""`make lint`: snakemake's linter over the workflow. It may report one finding, on purpose:
rules without a conda environment or container (jobs get their software from the venv, the
Alliance venv in $SLURM_TMPDIR, or modules; README, "Lint"). Any other finding is listed
and the exit status is 1.

    python tests/lint_workflow.py [--snakefile FILE] [--directory DIR] [--configfile FILE...]

It calls snakemake's Python API: in snakemake 9.27 `snakemake --lint json` prints text (the
command line does not pass `json` on), so there is nothing to parse there.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCEPTED = "Specify a conda environment or container for each rule."


def lint_findings(snakefile: Path, directory: Path, configfiles=()) -> list[tuple[str, str]]:
    """(where, title) of every lint, rules and snakefiles alike."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    printed = io.StringIO()
    with SnakemakeApi(OutputSettings()) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(),
            config_settings=ConfigSettings(configfiles=[Path(f) for f in configfiles]),
            snakefile=Path(snakefile).resolve(),
            workdir=Path(directory).resolve(),
        )
        with contextlib.redirect_stdout(printed):
            workflow.lint(json=True)
    try:
        report = json.loads(printed.getvalue())
    except json.JSONDecodeError:
        raise SystemExit(f"lint: snakemake printed no JSON report:\n{printed.getvalue()[-2000:]}")
    findings = []
    for item in report["snakefiles"] + report["rules"]:
        place = item["for"]
        where = (f"{place['snakefile']}:{place['line']} rule {place['rule']}" if "rule" in place
                 else place["snakefile"])
        findings += [(where, lint["title"]) for lint in item["lints"]]
    return findings


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--snakefile", default=ROOT / "Snakefile")
    p.add_argument("--directory", default=ROOT)
    p.add_argument("--configfile", nargs="*", default=[])
    a = p.parse_args(argv)
    findings = lint_findings(a.snakefile, a.directory, a.configfile)
    accepted = [f for f in findings if f[1] == ACCEPTED]
    others = [f for f in findings if f[1] != ACCEPTED]
    for where, title in others:
        print(f"{where}: {title}")
    print(f"snakemake --lint: {len(accepted)} rule(s) without conda/container (accepted, see "
          f"README, \"Lint\"), {len(others)} other finding(s)")
    return 1 if others else 0


if __name__ == "__main__":
    sys.exit(main())
