"""From the demo to real data and back: data.source switched between synthetic, archive and
download in the same results directory, through real snakemake runs; the download from a
local http.server (the real download code)."""

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ENV, PY, ROOT, served_tarball, snakemake, summary_rows
from cifarflow.files import file_digest
from cifarflow import data

LOCAL = ROOT / "tests/configs/local/config.yaml"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A CIFAR-format tarball (not the config's synthetic data) and its URL on this machine."""
    with served_tarball(tmp_path_factory.mktemp("served"), train_size=500, test_size=100) as out:
        yield out


def source_config(tmp_path, source, archive, url) -> list:
    """The local test config with data.source set as a user would edit it."""
    md5 = file_digest(archive, "md5")
    keys = {"synthetic": {"source": "synthetic"},
            "archive": {"source": "archive", "archive": str(archive), "md5": md5},
            "download": {"source": "download", "url": url, "md5": md5}}[source]
    overlay = tmp_path / f"{source}.yaml"
    overlay.write_text(json.dumps({"data": keys}))  # JSON is YAML
    return [LOCAL, overlay]


def extracted_md5(workdir) -> str:
    """The md5 of the extracted test batch (a synthetic tarball's own md5 changes with the
    time stamp in its gzip header)."""
    return file_digest(workdir / "results/data/cifar-10-batches-py" / data.TEST_FILE, "md5")


@pytest.mark.slow  # eight snakemake runs: about 25 s
def test_every_switch_of_data_source_reruns_fetch_and_extract(tmp_path, served):
    archive, url = served
    work = tmp_path / "work"
    order = ["synthetic", "archive", "download", "synthetic", "download", "archive", "synthetic"]
    used = []
    for source in order:  # all six switches
        config = source_config(tmp_path, source, archive, url)
        if source == "synthetic" and used:  # real data is replaced only on purpose
            refused = snakemake(work, "-n", "extract_dataset", configfile=config, check=False)
            assert refused.returncode != 0
            assert "would replace it with a synthetic set" in refused.stdout + refused.stderr
            shutil.rmtree(work / "results/data")
        out = snakemake(work, "--cores", 1, "extract_dataset", configfile=config)
        assert "fetch_dataset" in out.stdout + out.stderr, source
        used.append(extracted_md5(work))
    synthetic = used[0]
    real = file_digest(archive.parent / data.BATCHES_DIR / data.TEST_FILE, "md5")
    assert synthetic != real
    assert used == [synthetic, real, real, synthetic, real, real, synthetic]
    nothing = snakemake(work, "-n", "extract_dataset",
                        configfile=source_config(tmp_path, "synthetic", archive, url))
    assert "Nothing to be done" in nothing.stdout + nothing.stderr


def test_a_stale_tarball_is_refused_when_params_do_not_trigger(tmp_path, served):
    """With --rerun-triggers mtime, snakemake does not fetch again after a switch: extraction
    refuses the demo's tarball instead of training on it."""
    archive, url = served
    work = tmp_path / "work"
    snakemake(work, "--cores", 1, "extract_dataset",
              configfile=source_config(tmp_path, "synthetic", archive, url))
    out = snakemake(work, "--cores", 1, "--rerun-triggers", "mtime", "--forcerun",
                    "extract_dataset", "--", "extract_dataset", check=False,
                    configfile=source_config(tmp_path, "archive", archive, url))
    assert out.returncode != 0
    log = (work / "results/logs/extract_dataset.log").read_text()
    assert "data.source synthetic" in log and "--forcerun fetch_dataset" in log


@pytest.mark.slow
def test_training_follows_the_switch_from_the_demo_to_real_data(tmp_path, served):
    archive, url = served
    work = tmp_path / "work"
    snakemake(work, "--cores", 2, configfile=source_config(tmp_path, "synthetic", archive, url))
    snakemake(work, "--cores", 2, configfile=source_config(tmp_path, "download", archive, url))
    spec = json.loads((work / "results/runs/cpu/spec.json").read_text())
    assert spec["data_id"] == file_digest(archive, "md5")
    history = [json.loads(line) for line in
               (work / "results/runs/cpu/segment-2/metrics.jsonl").read_text().splitlines()]
    assert len(history) == 3 and history[0]["epoch"] == 1  # trained again from the start
    log = (work / "results/logs/train/cpu/segment-1.log").read_text()
    assert "resumed" not in log
    row = summary_rows(work)["cpu"]  # what the run trained on, in summary.csv and show
    assert (row["data_source"], row["data_md5"]) == ("download", file_digest(archive, "md5"))
    shown = subprocess.run([str(Path(PY).parent / "cifarflow"), "show", str(work / "results")],
                           capture_output=True, text=True, check=True).stdout
    assert f"download {file_digest(archive, 'md5')[:8]}" in shown


def documented_data_commands() -> list[str]:
    """The data commands of README.md and docs/slurm.md, as written (inline or in a block)."""
    found = []
    for doc in ("README.md", "docs/slurm.md"):
        text = (ROOT / doc).read_text()
        found += [re.sub(r"\s+", " ", c) for c in
                  re.findall(r"`(snakemake --profile profiles/slurm extract_dataset[^`]*)`", text)]
        found += re.findall(r"^\s*(snakemake --profile profiles/slurm extract_dataset.*)$", text,
                            flags=re.M)
    return found


@pytest.mark.slow  # three runs through the Slurm profile, ~40 s each (its executor's own waits)
def test_the_documented_data_commands_fetch_and_a_synthetic_plan_then_is_refused(tmp_path, served):
    """README's and docs/slurm.md's commands, run as written (the project's Snakefile,
    its Slurm profile; the dataset rules are local rules), fetch the tarball (the docs'
    `data.source: download` edit made in a config file, the URL pointed at this machine);
    then a plain run of a config that still says synthetic is refused at -n and for real,
    and the real data stays."""
    archive, url = served
    commands = documented_data_commands()
    assert len(commands) == 3, commands  # README, slurm.md's block and its one-off form
    md5 = file_digest(archive, "md5")
    edited = tmp_path / "config.yaml"  # what the docs ask: data.source download
    edited.write_text(json.dumps({"data": {"source": "download", "url": url, "md5": md5}}))
    for i, command in enumerate(commands):
        work = tmp_path / f"work{i}"
        words = shlex.split(command)
        url_config = f"data={{'source': 'download', 'url': '{url}', 'md5': '{md5}'}}"
        words = [url_config if w == 'data={"source": "download"}' else w for w in words]
        out = subprocess.run([str(Path(PY).parent / "snakemake"), "-s", str(ROOT / "Snakefile"),
                              "--directory", str(work), "--configfile", str(LOCAL), str(edited),
                              *words[1:]], cwd=ROOT, env=ENV, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, f"{command}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
        assert file_digest(work / f"results/data/{data.ARCHIVE_NAME}", "md5") == md5
    plain = snakemake(work, "-n", configfile=source_config(tmp_path, "synthetic", archive, url),
                      check=False)
    text = plain.stdout + plain.stderr
    assert plain.returncode != 0 and f"holds CIFAR-10 (data.source download, md5 {md5})" in text
    assert "set data.source: download in config/config.yaml" in text and "remove" in text
    again = snakemake(work, "--cores", 1, check=False,
                      configfile=source_config(tmp_path, "synthetic", archive, url))
    assert again.returncode != 0
    assert file_digest(work / f"results/data/{data.ARCHIVE_NAME}", "md5") == md5  # kept
