"""Reading what the project writes: JSON-lines files (epoch records, tries) and the digest
of a file (md5 of the dataset, sha256 of checkpoints). No torch."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHUNK = 1 << 22  # bytes read at a time: a checkpoint or an archive never sits in memory whole


def file_digest(path, algorithm: str) -> str:
    """Hex digest of a file's bytes ("md5", "sha256", any name hashlib knows)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _record_after_cut(line: str) -> dict | None:
    """The whole record on a line that starts with a cut one (the next write went on right
    after it): the leftmost suffix that is a JSON object, None where there is none."""
    start = line.find("{", 1)
    while start != -1:
        try:
            record = json.loads(line[start:])
        except ValueError:
            start = line.find("{", start + 1)
            continue
        return record if isinstance(record, dict) else None
    return None


def read_jsonl(path) -> list:
    """The records of a JSON-lines file, in order. Every writer here writes a record and
    its newline in one write, so the only damage a kill leaves is a record cut short:
    at the end of the file (no newline after it) it is dropped; where a later write went
    on after it on the same line, the cut part is dropped and the later record kept.
    Blank lines are skipped. Any other line that is not JSON raises ValueError naming the
    file and the line (a damaged file: nothing is guessed)."""
    lines = Path(path).read_text().split("\n")  # the last piece: "" or a cut record
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
            continue
        except ValueError:
            pass
        if number == len(lines):
            continue  # cut by a kill mid-write: the records before it count
        found = _record_after_cut(line)
        if found is None:
            raise ValueError(f"{path}, line {number}: not a JSON record ({line[:60]!r}): the "
                             "file is damaged; repair or delete that line")
        records.append(found)
    return records
