"""Each dataset in the folder of its data id: a switch of data.source fetches into another
folder and keeps the others; an older results folder's one results/data is the folder of
the data id its fetch record names."""

import json

from cifarflow import data
from cifarflow.data_folders import data_folder, describe_data, kept_data


def fetched(folder, source: str, data_id: str, md5: str, extracted: bool = True):
    """What fetch-data (and extract-data) leave in a folder, but the tarball's bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / data.ARCHIVE_NAME).write_bytes(b"tarball")
    (folder / f"{data.ARCHIVE_NAME}.fetched.json").write_text(
        json.dumps({"source": source, "data_id": data_id, "md5": md5}) + "\n")
    if extracted:
        (folder / data.BATCHES_DIR).mkdir()


def test_each_data_id_has_its_own_folder(tmp_path):
    results = str(tmp_path / "results")
    assert data_folder(results, "synthetic-0123456789ab") == \
        f"{results}/data/synthetic-0123456789ab"
    assert data_folder(results, "c58f30108f718f92721af3b95e74349a") == \
        f"{results}/data/c58f30108f718f92721af3b95e74349a"
    assert kept_data(results) == {}


def test_an_older_results_folder_is_read_as_its_fetch_records_data_id(tmp_path):
    results = tmp_path / "results"
    real = "c58f30108f718f92721af3b95e74349a"
    fetched(results / "data", "download", real, real)  # the one results/data of old
    fetched(results / "data/synthetic-0123456789ab", "synthetic", "synthetic-0123456789ab",
            "e" * 32, extracted=False)
    assert data_folder(str(results), real) == f"{results}/data"
    assert data_folder(str(results), "synthetic-0123456789ab") == \
        f"{results}/data/synthetic-0123456789ab"
    assert kept_data(str(results)) == {
        real: {"folder": f"{results}/data", "source": "download", "md5": real,
               "extracted": True},
        "synthetic-0123456789ab": {"folder": f"{results}/data/synthetic-0123456789ab",
                                   "source": "synthetic", "md5": "e" * 32, "extracted": False}}


def test_the_dry_run_says_which_folder_the_plan_uses_and_which_others_are_kept(tmp_path):
    results = tmp_path / "results"
    real = "c58f30108f718f92721af3b95e74349a"
    fetched(results / "data" / real, "archive", real, real)
    said = describe_data(str(results), "synthetic-0123456789ab", "synthetic")
    assert said == (f"data: {results}/data/synthetic-0123456789ab (data.source synthetic, "
                    "data id synthetic-0123456789ab): to be fetched; also kept, unused by this "
                    f"plan: c58f30108f718f92 (archive) in {results}/data/{real}")
    assert describe_data(str(results), real, "archive") == (
        f"data: {results}/data/{real} (data.source archive, data id {real}): fetched and "
        "extracted")
