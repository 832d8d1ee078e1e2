"""From the demo to real data and back: data.source switched between synthetic, archive and
download in the same results directory, through real snakemake runs (no Slurm); the download
from a local http.server (the real download code). Each dataset lives in the folder of its
data id (results/data/<data id>/): no switch replaces or refuses another's data."""

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import ENV, PY, ROOT, served_tarball, snakemake, summary_rows
from cifarflow.config import data_identity, with_defaults
from cifarflow.data_folders import kept_data
from cifarflow.files import file_digest
from cifarflow import data

LOCAL = ROOT / "tests/configs/local/config.yaml"
SHORT = {"train": {"epochs": 1}, "segments": {"count": 1}}  # one epoch, one segment


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A CIFAR-format tarball (not the config's synthetic data) and its URL on this machine."""
    with served_tarball(tmp_path_factory.mktemp("served"), train_size=500, test_size=100) as out:
        yield out


def source_config(tmp_path, source, archive, url, **more) -> list:
    """The local test config with data.source set as a user would edit it (and `more`
    sections, e.g. SHORT)."""
    md5 = file_digest(archive, "md5")
    keys = {"synthetic": {"source": "synthetic"},
            "archive": {"source": "archive", "archive": str(archive), "md5": md5},
            "download": {"source": "download", "url": url, "md5": md5}}[source]
    overlay = tmp_path / f"{source}.yaml"
    overlay.write_text(json.dumps({"data": keys, **more}))  # JSON is YAML
    return [LOCAL, overlay]


def synthetic_id() -> str:
    """The data id of the local config's synthetic data."""
    import yaml

    return data_identity(with_defaults(yaml.safe_load(LOCAL.read_text()))["data"])


def extracted_md5(workdir, data_id: str) -> str:
    """The md5 of the extracted test batch of a data id (a synthetic tarball's own md5
    changes with the time stamp in its gzip header)."""
    folder = kept_data(str(Path(workdir) / "results"))[data_id]["folder"]
    return file_digest(Path(folder) / data.BATCHES_DIR / data.TEST_FILE, "md5")


@pytest.mark.slow  # seven snakemake runs: about 25 s
def test_every_switch_of_data_source_keeps_each_dataset(tmp_path, served):
    """Six switches in one results folder: never a refusal, never a dataset deleted; a
    data id fetched once is fetched again only when its source changed (archive and
    download share the real data's md5: one folder), the demo's never again."""
    archive, url = served
    real = file_digest(archive, "md5")
    work = tmp_path / "work"
    order = ["synthetic", "archive", "download", "synthetic", "download", "archive", "synthetic"]
    fetched, used = [], []
    for source in order:
        out = snakemake(work, "--cores", 1, "extract_dataset",
                        configfile=source_config(tmp_path, source, archive, url))
        fetched.append("fetch_dataset" in out.stdout + out.stderr)
        data_id = synthetic_id() if source == "synthetic" else real
        used.append(extracted_md5(work, data_id))
        kept = kept_data(str(work / "results"))
        assert kept[data_id]["folder"] == str(work / "results/data" / data_id)
        assert all(v["extracted"] for v in kept.values())  # the other's data stays
    assert fetched == [True, True, True, False, False, True, False]
    demo, real_batch = used[0], file_digest(archive.parent / data.BATCHES_DIR / data.TEST_FILE,
                                            "md5")
    assert demo != real_batch
    assert used == [demo, real_batch, real_batch, demo, real_batch, real_batch, demo]
    nothing = snakemake(work, "-n", "extract_dataset",
                        configfile=source_config(tmp_path, "archive", archive, url))
    assert "Nothing to be done" in nothing.stdout + nothing.stderr


def test_with_rerun_triggers_mtime_a_switch_still_fetches_into_its_own_folder(tmp_path, served):
    """--rerun-triggers mtime leaves params out, so a switch used to find the demo's tarball
    in place; now the real data's folder has none, so it is fetched, and used."""
    archive, url = served
    work = tmp_path / "work"
    snakemake(work, "--cores", 1, "extract_dataset",
              configfile=source_config(tmp_path, "synthetic", archive, url))
    out = snakemake(work, "--cores", 1, "--rerun-triggers", "mtime", "--", "extract_dataset",
                    configfile=source_config(tmp_path, "archive", archive, url))
    assert "fetch_dataset" in out.stdout + out.stderr
    assert extracted_md5(work, file_digest(archive, "md5")) == \
        file_digest(archive.parent / data.BATCHES_DIR / data.TEST_FILE, "md5")
    assert kept_data(str(work / "results"))[synthetic_id()]["extracted"]


@pytest.mark.slow  # four short workflow runs: about 40 s
def test_demo_then_own_archive_then_demo_again_trains_each_and_deletes_nothing(tmp_path, served):
    """What a new user does in one results folder: the synthetic demo, then their own
    archive, then the demo again, then the archive again: four runs, none refused; each
    run's spec and summary row name the data id it trained on; the archive's data is never
    fetched twice, the demo's never replaced."""
    archive, url = served
    real = file_digest(archive, "md5")
    work = tmp_path / "work"
    trained = []
    for source in ("synthetic", "archive", "synthetic", "archive"):
        config = source_config(tmp_path, source, archive, url, **SHORT)
        data_id = synthetic_id() if source == "synthetic" else real
        dry = snakemake(work, "-n", configfile=config).stdout
        assert f"data: results/data/{data_id} (data.source {source}, data id {data_id})" in dry
        out = snakemake(work, "--cores", 2, "-p", configfile=config)
        said = out.stdout + out.stderr
        trained.append(("fetch_dataset" in said,
                        json.loads((work / "results/runs/cpu/spec.json").read_text())["data_id"],
                        summary_rows(work)["cpu"]["data_id"]))
        assert f"--data results/data/{data_id}/cifar-10-batches-py" in said, said[-3000:]
        kept = kept_data(str(work / "results"))
        assert sorted(kept) == sorted({synthetic_id(), real} if len(trained) > 1
                                      else {synthetic_id()})
        assert all(v["extracted"] for v in kept.values())
    demo = synthetic_id()
    assert trained == [(True, demo, demo), (True, real, real), (False, demo, demo),
                       (False, real, real)]
    said = snakemake(work, "-n", configfile=source_config(tmp_path, "synthetic", archive, url,
                                                          **SHORT)).stdout
    assert f"also kept, unused by this plan: {real[:16]} (archive) in results/data/{real}" in said


def test_an_older_results_folder_keeps_its_one_data_folder(tmp_path, served):
    """A results folder of before data ids (the tarball and its batches right in
    results/data) is the folder of the data id its fetch record names: used in place, not
    fetched again; another source goes into a folder of its own beside it."""
    archive, url = served
    work = tmp_path / "work"
    old = work / "results/data"
    tarball = data.prepare_archive("archive", old, archive=str(archive),
                                   md5=file_digest(archive, "md5"))
    data.extract_archive(tarball, old)
    config = source_config(tmp_path, "archive", archive, url)
    dry = snakemake(work, "-n", configfile=config)
    assert f"data: results/data (data.source archive, data id {file_digest(archive, 'md5')}): " \
        "fetched and extracted" in dry.stdout
    assert not re.search(r"\b(fetch|extract)_dataset\b +1", dry.stdout), dry.stdout
    snakemake(work, "--cores", 1, "extract_dataset",
              configfile=source_config(tmp_path, "synthetic", archive, url))
    assert (old / synthetic_id() / data.BATCHES_DIR / data.TEST_FILE).is_file()
    assert file_digest(old / data.ARCHIVE_NAME, "md5") == file_digest(archive, "md5")  # kept


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
    assert row["data_id"] == file_digest(archive, "md5")
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


@pytest.mark.slow  # five snakemake runs: about 20 s
def test_the_documented_data_commands_fetch_and_a_synthetic_plan_then_keeps_them(tmp_path,
                                                                                served):
    """README's and docs/slurm.md's commands, run as written but with the local profile
    for the Slurm one (the dataset rules are local rules: they run where snakemake runs),
    fetch the tarball (the docs' `data.source: download` edit made in a config file, the
    URL pointed at this machine); then a config that still says synthetic plans, names
    the downloaded data as kept, and trains on its own folder: the real data stays."""
    archive, url = served
    commands = documented_data_commands()
    assert len(commands) == 4, commands  # README, slurm.md's first day, its recipe and one-off form
    md5 = file_digest(archive, "md5")
    edited = tmp_path / "config.yaml"  # what the docs ask: data.source download
    edited.write_text(json.dumps({"data": {"source": "download", "url": url, "md5": md5}}))
    for i, command in enumerate(commands):
        work = tmp_path / f"work{i}"
        words = shlex.split(command.replace("profiles/slurm", "profiles/local"))
        url_config = f"data={{'source': 'download', 'url': '{url}', 'md5': '{md5}'}}"
        words = [url_config if w == 'data={"source": "download"}' else w for w in words]
        out = subprocess.run([str(Path(PY).parent / "snakemake"), "-s", str(ROOT / "Snakefile"),
                              "--directory", str(work), "--configfile", str(LOCAL), str(edited),
                              *words[1:]], cwd=ROOT, env=ENV, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, f"{command}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
        assert file_digest(work / f"results/data/{md5}/{data.ARCHIVE_NAME}", "md5") == md5
    demo = source_config(tmp_path, "synthetic", archive, url)
    plain = snakemake(work, "-n", configfile=demo)
    assert f"also kept, unused by this plan: {md5[:16]} (download) in results/data/{md5}" \
        in plain.stdout
    snakemake(work, "--cores", 1, "extract_dataset", configfile=demo)
    assert file_digest(work / f"results/data/{md5}/{data.ARCHIVE_NAME}", "md5") == md5  # kept
    assert (work / f"results/data/{synthetic_id()}/{data.BATCHES_DIR}").is_dir()
