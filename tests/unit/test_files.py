"""One JSON-lines reader for every record file (epoch records, tries), one digest of a file."""

import hashlib
import json

import pytest

from cifarflow.results import aggregate

from cifarflow.engine.checkpoints import files as checkpoint

from cifarflow.job import tries
from cifarflow.files import CHUNK, file_digest, read_jsonl

A, B, C = {"epoch": 1, "loss": 2.25}, {"epoch": 2, "nested": {"x": [1, 2]}}, {"epoch": 3}


def lines(*records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_whole_records_in_order_blank_lines_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(lines(A, B) + "\n" + lines(C))
    assert read_jsonl(path) == [A, B, C]


def test_a_record_cut_at_the_end_is_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    whole = lines(A, B)
    for cut in range(1, len(json.dumps(C))):  # every place a kill could cut the last write
        path.write_text(whole + json.dumps(C)[:cut])
        assert read_jsonl(path) == [A, B], cut


def test_a_record_written_after_a_cut_one_is_kept(tmp_path):
    """The cut record got no newline, so the next write goes on on its line."""
    path = tmp_path / "tries.jsonl"
    for cut in range(1, len(json.dumps(B))):
        path.write_text(lines(A) + json.dumps(B)[:cut] + lines(C))
        assert read_jsonl(path) == [A, C], cut


def test_a_damaged_line_is_an_error_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(lines(A) + "garbage\n" + lines(C))
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a JSON record "
                                         r"\('garbage'\): the file is damaged"):
        read_jsonl(path)


def test_every_reader_of_records_reads_them_the_same_way(tmp_path, monkeypatch):
    (tmp_path / checkpoint.METRICS).write_text(lines(A, B) + '{"epoch": 3, "lo')
    assert checkpoint.read_metrics(tmp_path) == [A, B]
    assert aggregate.read_jsonl is read_jsonl
    monkeypatch.delenv(tries.INVOCATION, raising=False)
    tries.record(tmp_path, 1, 1, "start")
    with open(tmp_path / tries.TRIES, "a") as f:
        f.write('{"segment": 1, "attempt": 1, "ev')  # a rank killed mid-write
    tries.record(tmp_path, 1, 1, "end", ended="completed")
    assert [e["event"] for e in tries.read(tmp_path)] == ["start", "end"]


@pytest.mark.parametrize("algorithm", ["md5", "sha256"])
def test_file_digest_over_several_chunks(tmp_path, algorithm):
    data = bytes(range(256)) * (CHUNK // 256 * 2 + 3)  # two whole chunks and a part
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert file_digest(path, algorithm) == hashlib.new(algorithm, data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert file_digest(tmp_path / "empty", algorithm) == hashlib.new(algorithm).hexdigest()
