"""Each prepared dataset in a folder of its own, named by its data id
(config.data_identity: the archive's md5, or ``synthetic-`` and a hash of the synthetic
parameters): ``results/data/<data id>/`` holds its tarball, the tarball's fetch record and
the extracted ``cifar-10-batches-py/``. Switching data.source back and forth then replaces
nothing and refuses nothing: the plan reads the folder of its data id, fetched once.

An older results folder keeps its one ``results/data/`` (tarball and batches directly in
it): that is the folder of the data id its fetch record names. No torch."""

from __future__ import annotations

from pathlib import Path

from .data import ARCHIVE_NAME, BATCHES_DIR, fetch_record


def data_root(results: str) -> Path:
    return Path(results) / "data"


def recorded_id(folder: Path) -> str | None:
    """The data id of the tarball fetched into ``folder`` (None: none fetched there)."""
    record = fetch_record(Path(folder) / ARCHIVE_NAME)
    return record.get("data_id") if record else None


def data_folder(results: str, data_id: str) -> str:
    """Where the data of ``data_id`` is fetched and extracted: results/data/<data id>, or
    results/data itself where an older results folder fetched that data id there."""
    root = data_root(results)
    return str(root) if recorded_id(root) == data_id else str(root / data_id)


def kept_data(results: str) -> dict[str, dict]:
    """data id -> {folder, source, md5, extracted} of every dataset fetched under
    results/data (the older layout's included)."""
    root = data_root(results)
    folders = [root] + (sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else [])
    kept = {}
    for folder in folders:
        record = fetch_record(folder / ARCHIVE_NAME)
        if record and record.get("data_id"):
            kept[record["data_id"]] = {"folder": str(folder), "source": record["source"],
                                       "md5": record["md5"],
                                       "extracted": (folder / BATCHES_DIR).is_dir()}
    return kept


def describe_data(results: str, data_id: str, source: str) -> str:
    """What `snakemake -n` says of the data: the folder this plan uses, and the others
    kept (each named by its data id, its source and whether it is extracted)."""
    kept = kept_data(results)
    used = data_folder(results, data_id)
    state = ("fetched and extracted" if kept.get(data_id, {}).get("extracted") else
             "fetched, to be extracted" if data_id in kept else "to be fetched")
    line = f"data: {used} (data.source {source}, data id {data_id}): {state}"
    others = [f"{k[:16]} ({v['source']}{'' if v['extracted'] else ', not extracted'}) in "
              f"{v['folder']}" for k, v in sorted(kept.items()) if k != data_id]
    if others:
        line += "; also kept, unused by this plan: " + "; ".join(others)
    return line
