"""segments.keep_weights last: once a segment is published, the weights of the run's earlier
segments go, but the best one's; each keeps its metrics and says in its manifest why its
weights went (a checkpoint without them is never resumed from). No torch."""

from __future__ import annotations

import json
from pathlib import Path

from .files import MANIFEST, METRICS, atomic_write_text, read_manifest, read_metrics


def is_weights(rel: str) -> bool:
    """A checkpoint's payload (model and optimizer state, DCP shards), not its small files
    (the manifest, metrics and other JSON)."""
    return not rel.endswith((".json", ".jsonl"))


def drop_weights(directory: Path, why: str) -> int:
    """Remove a published checkpoint's payload, keep its metrics, and say so in its manifest
    (read_manifest then refuses to resume from it); the bytes freed. The directory's
    .snakemake_timestamp, which Snakemake reads as its time, is untouched."""
    directory = Path(directory)
    manifest = read_manifest(directory, verify=False)
    payload = [rel for rel in manifest["files"] if is_weights(rel)]
    freed = 0
    for rel in payload:
        f = directory / rel
        if f.is_file():
            freed += f.stat().st_size
            f.unlink()
    for sub in sorted({(directory / rel).parent for rel in payload}, reverse=True):
        if sub != directory and sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    manifest["files"] = {rel: v for rel, v in manifest["files"].items() if not is_weights(rel)}
    manifest["weights_dropped"] = why
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=1))
    return freed


def keep_last_and_best(directory: Path) -> list[tuple[str, int]]:
    """segments.keep_weights last, once segment ``directory`` (segment-k of a run) is
    published: drop the weights of the run's earlier segments but the best one's (highest
    test accuracy at its end; the latest of equals). [(segment, bytes freed)]."""
    directory = Path(directory)
    segments = sorted((d for d in directory.parent.glob("segment-*") if d.is_dir()
                       and (d / MANIFEST).is_file()),
                      key=lambda d: int(d.name.split("-")[1]))
    segments = [d for d in segments if int(d.name.split("-")[1]) <= int(directory.name.split("-")[1])]
    accuracy = {}
    for d in segments:
        records = read_metrics(d) if (d / METRICS).is_file() else []
        accuracy[d] = records[-1].get("test_acc", -1) if records else -1
    best = max(reversed(segments), key=lambda d: accuracy[d]) if segments else None
    dropped = []
    for d in segments:
        if d in (directory, best) or read_manifest(d, verify=False).get("weights_dropped"):
            continue
        why = (f"segments.keep_weights last: dropped once {directory.name} was written "
               f"({best.name} holds the best test accuracy)")
        dropped.append((d.name, drop_weights(d, why)))
    return dropped
