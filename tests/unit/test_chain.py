"""Packs and chains in-process: which runs share a pack, and which segments the chain walk
asks for (pruning cuts, extra segments, a pack's members), on written checkpoints."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from cifarflow.controller.chain import Chain
from cifarflow.config import with_defaults
from cifarflow.controller.pack_plan import build_packs
from cifarflow.controller.plan import build_runs

BASE = with_defaults(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))


def plan(**over):
    cfg = copy.deepcopy(BASE)
    for key, value in over.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and key != "sweep" else value
    return build_runs(cfg)


def test_packs_hold_runs_of_one_strategy_and_one_request():
    runs = plan(strategies=["cpu", "ddp"],
                sweep={"lr": [0.1, 0.2, 0.3], "cpus_per_task": [1, 2]})
    packs = build_packs(runs, 2)
    assert {p.strategy for p in packs.values()} == {"cpu"}  # ddp: several processes per run
    for pack in packs.values():
        assert 1 <= len(pack.members) <= 2
        requests = {repr(sorted(runs[m].resources.items())) for m in pack.members}
        assert len(requests) == 1, pack  # never a member in a job of the wrong size
        assert pack.member_resources == runs[pack.members[0]].resources
    packed = sorted(m for p in packs.values() for m in p.members)
    assert packed == sorted(n for n in runs if n.startswith("cpu"))
    assert len(packs) == 4  # 3 runs of cpus 1 -> 2 packs, 3 of cpus 2 -> 2 packs
    assert build_packs(runs, 1) == {}


class Pending(Exception):
    pass


def write_segment(root: Path, run: str, k: int, done: bool, test_acc: float) -> str:
    path = root / run / f"segment-{k}"
    path.mkdir(parents=True)
    (path / "checkpoint.json").write_text(json.dumps({"format": 1, "done": done}))
    (path / "metrics.jsonl").write_text(json.dumps({"epoch": k, "test_acc": test_acc}) + "\n")
    return str(path)


def test_chain_gives_each_pack_segment_the_members_that_need_it(tmp_path):
    """4 runs in 2 packs, 3 planned segments, the best half kept after segment 1; one
    survivor stops early in segment 3 and needs a fourth."""
    runs = plan(sweep={"lr": [0.1, 0.2, 0.3, 0.4]}, train={"epochs": 3},
                segments={"count": 3})
    packs = build_packs(runs, 2)
    prune = {"metric": "test_acc", "keep": 0.5, "min_runs": 1, "at_segments": [1]}
    have = {}

    def segment_of(run, k):
        if (run, k) not in have:
            raise Pending(run, k)
        return have[(run, k)]

    chain = Chain(runs, packs, prune, 13, segment_of, Pending)
    names = list(runs)
    assert chain.members("cpu-pack001", 1) == names[:2]
    with pytest.raises(Pending):
        chain.members("cpu-pack001", 2)  # the ranking is not known yet
    for i, run in enumerate(names):
        have[(run, 1)] = write_segment(tmp_path, run, 1, False, test_acc=i / 10)
    assert chain.alive_after(("cpu", 0), 1) == (names[3], names[2])
    assert chain.members("cpu-pack001", 2) == [] and chain.members("cpu-pack002", 2) == names[2:]
    assert chain.known_pruned_at(names[0]) == 1 and chain.known_pruned_at(names[3]) is None
    for run in names[2:]:
        have[(run, 2)] = write_segment(tmp_path, run, 2, False, 0.5)
    have[(names[2], 3)] = write_segment(tmp_path, names[2], 3, True, 0.6)
    have[(names[3], 3)] = write_segment(tmp_path, names[3], 3, False, 0.6)  # stopped early
    assert chain.members("cpu-pack002", 4) == [names[3]]
    assert chain.final_segment(names[2]).endswith("segment-3")
    assert chain.final_segment(names[0]).endswith("segment-1")
    with pytest.raises(Pending):
        chain.final_segment(names[3])
