"""What a plan will hold under results/, said at `snakemake -n`: the registered models'
sizes (their cards: test_model_cards.py), the count of files, folders and bytes of every segment, and
that count against the room under results: (statvfs, a recorded `lfs quota` answer)."""

import grp
import re

import pytest

from cifarflow.config import with_defaults
from cifarflow.controller import quota
from test_workflow_plan import bin_dir  # noqa: F401
from cifarflow.controller.pack_plan import build_packs
from cifarflow.controller.plan import KEEP_ALL_RUNS, build_runs, settle_keep_weights
from cifarflow.controller.quota import check_room, parse_lfs_quota, room
from cifarflow.controller.storage import (CIFAR_BYTES, FIXED_INODES, describe, estimate,
                                          state_bytes)


def test_a_checkpoint_holds_weights_and_the_optimizers_buffers():
    assert state_bytes("lenet", "sgd", 0.9) == 2 * 248_024  # 518 KB measured for state.pt
    assert state_bytes("lenet", "sgd", 0.0) == 248_024
    assert state_bytes("resnet18", "adam", 0.0) == 3 * 44_695_848 + 38_560
    assert state_bytes("pkg.mod:factory", "sgd", 0.9) is None
    measured = {"pkg.mod:factory": (1_000, 24)}  # what check_user_models built
    assert state_bytes("pkg.mod:factory", "sgd", 0.9, measured) == 2 * 1_000 + 24


def test_the_line_counts_every_segment_and_what_keep_last_would_hold():
    runs = build_runs(with_defaults({"strategies": ["cpu"], "segments": {"count": 10},
                                     "train": {"model": "resnet18", "epochs": 10},
                                     "sweep": {"lr": [0.01 * i for i in range(1, 101)]}}))
    est = estimate(runs.values())
    size = state_bytes("resnet18", "sgd", 0.9)
    # 100 runs x (2 + 11 x 9) files: 10 segments and the work checkpoint, one try each;
    # folders: 5 a run and 1 a segment; weights: 11 checkpoints a run, 3 with "last"
    assert (est.files, est.dirs) == (FIXED_INODES + 100 * (2 + 11 * 9), 100 * (5 + 10))
    small = 1000 * 20_000 + CIFAR_BYTES
    assert describe(est, "all") == (
        f"storage: 100 run(s) will hold ~{est.files:,} files and 1,500 folders, "
        f"~{(1100 * size + small) / 1e9:,.1f} GB under results/ (segments.keep_weights all; "
        f"last would keep ~{(300 * size + small) / 1e9:,.1f} GB)")
    assert "last would keep" not in describe(est, "last")


def test_fsdp_shards_and_pack_records_are_counted():
    fsdp = build_runs(with_defaults({"strategies": ["fsdp"], "segments": {"count": 2},
                                     "distributed": {"world_size": 4}}))
    plain = build_runs(with_defaults({"strategies": ["ddp"], "segments": {"count": 2},
                                      "distributed": {"world_size": 4}}))
    # each of 3 checkpoints (2 segments, work): trainer.pt, shards/, .metadata, 4 .distcp
    assert estimate(fsdp.values()).files - estimate(plain.values()).files == 3 * (1 + 4)
    assert estimate(fsdp.values()).dirs - estimate(plain.values()).dirs == 2
    runs = build_runs(with_defaults({"strategies": ["cpu"], "sweep": {"lr": [0.1, 0.2]}}))
    packs = build_packs(runs, 2)
    assert estimate(runs.values(), packs.values()).files == \
        estimate(runs.values()).files - 2 * 2 * 3 + 2 * 4  # the pack's records, not each run's


def test_keep_weights_auto_is_all_for_a_few_runs_and_last_for_a_sweep():
    def kept(n):
        runs = build_runs(with_defaults({"strategies": ["cpu"],
                                         "sweep": {"lr": [0.01 * i for i in range(1, n + 1)]}}))
        return {run.config.keep_weights for run in runs.values()}

    assert kept(KEEP_ALL_RUNS) == {"all"} and kept(KEEP_ALL_RUNS + 1) == {"last"}
    assert settle_keep_weights(with_defaults({"segments": {"keep_weights": "all"},
                                              "sweep": {"lr": list(range(1, 50))}})) \
        ["segments"]["keep_weights"] == "all"


LFS = """\
/lustre04/scratch/alice
                4471108  52428800 52428800       -   84117  500000  500000       -
"""


def test_an_lfs_quota_answer_is_what_is_left_under_the_limits():
    assert parse_lfs_quota(LFS) == {"bytes": (52428800 - 4471108) * 1024,
                                    "inodes": 500000 - 84117}
    assert parse_lfs_quota("/home/alice 10* 0 8 - 3 0 0 -") == {"bytes": 0, "inodes": None}
    assert parse_lfs_quota("lfs: not a Lustre filesystem") is None


def test_room_reads_statvfs_of_the_nearest_folder_and_the_tighter_lfs_quota(tmp_path):
    lfs = tmp_path / "lfs"
    lfs.write_text(f"#!/bin/sh\necho \"$*\" > {tmp_path}/asked\nprintf '{LFS}'\n")
    lfs.chmod(0o755)
    found = room(str(tmp_path / "results" / "sweep"), user="alice", lfs=str(lfs))
    assert found["path"] == str(tmp_path) and found["quota"]
    assert found["inodes"] == 500000 - 84117
    assert (tmp_path / "asked").read_text().split() == ["quota", "-q", "-u", "alice", str(tmp_path)]
    assert room(str(tmp_path), lfs="")["quota"] is False


def sweep(n: int, **segments):
    return build_runs(with_defaults({
        "strategies": ["cpu"], "train": {"model": "resnet18", "epochs": 4},
        "segments": {"count": 4, **segments}, "sweep": {"lr": [0.001 * i for i in range(1, n + 1)]}}))


PROJECT = {"path": "/project", "bytes": 1 << 30, "inodes": 65_000, "quota": False}  # 1 GiB


def test_a_sweep_that_cannot_fit_is_refused_naming_keep_last_and_a_larger_filesystem():
    est = estimate(sweep(1000, keep_weights="all").values())
    refusal, warning = check_room(est, "all", PROJECT)
    assert warning is None and refusal.startswith(
        f"storage: the plan needs ~{est.bytes('all') / 1e9:,.1f} GB under results:, more than "
        "/project (statvfs: 1.1 GB and 65,000 files free) has: it would fail mid-sweep; set "
        f"segments.keep_weights: last (~{est.bytes('last') / 1e9:,.1f} GB), or results: on a "
        "larger filesystem (/scratch")
    last, _ = check_room(est, "last", PROJECT)
    assert "keep_weights" not in last and "/scratch" in last
    few = {**PROJECT, "bytes": 10**15, "inodes": 100}
    assert f"~{est.inodes:,} files and folders" in check_room(est, "last", few)[0]


def test_a_plan_near_the_room_is_a_warning():
    est = estimate(sweep(2).values())
    need = est.bytes("all")
    assert check_room(est, "all", {**PROJECT, "bytes": int(need / 0.9)})[1].startswith(
        "storage: the plan takes 90% of what /project (statvfs: ")
    assert check_room(est, "all", {**PROJECT, "bytes": need * 2}) == (None, None)


def test_the_plan_refuses_a_1000_run_resnet18_sweep_on_a_small_filesystem(tmp_path, bin_dir):  # noqa: F811
    from cifarflow.controller.plan import PlanError
    from test_workflow_plan import make_plan

    over = dict(train={"model": "resnet18"}, sweep={"lr": [0.001 * i for i in range(1, 1001)]},
                pack={"runs_per_job": 10})
    plan = make_plan(tmp_path, bin_dir, jobs_at_once=100, **over)
    assert plan.config["segments"]["keep_weights"] == "last"  # auto, for a sweep
    with pytest.raises(PlanError, match=r"storage: the plan needs ~.* GB under results:, more "
                                        r"than /project \(statvfs: 1.1 GB"):
        plan.checks.against_cluster(lambda results: PROJECT, limits_of=lambda: None)
    local = make_plan(tmp_path, bin_dir, **over)
    local.checks.against_cluster(lambda results: PROJECT, limits_of=lambda: None)
    assert local.log.warnings[0].startswith("WARNING: storage: the plan needs")


# lfs's own answers in a project space: the group's quota (-g), the folder's project id
# (lfs project -d: id, inherit flag, path) and that project's quota (-p)
LFS_GROUP = "/lustre03\n       1040000000  1048576000 1048576000       -  402118  500000  500000       -"
LFS_PROJECT = "/lustre03   20  0 0       -  499990  0  500000       -"
LFS_USER = "/lustre03   20  0 0       -  3  0  0       -"  # nothing counted to the user


def stand_in_lfs(tmp_path, project_line):
    lfs = tmp_path / "bin" / "lfs"
    lfs.parent.mkdir()
    lfs.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/asked
case "$1 $3" in
  "project {tmp_path}"*) echo "{project_line}" ;;
  "quota -g") echo "{LFS_GROUP}" ;;
  "quota -p") echo "{LFS_PROJECT}" ;;
  "quota -u") echo "{LFS_USER}" ;;
esac
""")
    lfs.chmod(0o755)
    return str(lfs)


@pytest.mark.parametrize("project_line", ["   4567 P {path}", "      0 - {path}"])
def test_a_project_space_asks_the_group_s_and_the_project_s_quota(tmp_path, monkeypatch,
                                                                   project_line):
    """/project/def-pi/ana is the group def-pi's space: its quota is the group's (and the
    folder's Lustre project id's where it has one), not the user's (-u counts nothing there:
    a full project space passed the check); /home and /scratch keep the user's."""
    space = tmp_path / "project" / "def-pi" / "ana"
    space.mkdir(parents=True)
    lfs = stand_in_lfs(tmp_path, project_line.format(path=space))
    monkeypatch.setattr(quota, "PROJECT_SPACE", re.compile(re.escape(f"{tmp_path}/project/")))
    group = grp.getgrgid(space.stat().st_gid).gr_name
    found = room(str(space / "cifar"), user="ana", lfs=lfs)
    asked = (tmp_path / "asked").read_text().splitlines()
    assert asked[:2] == [f"project -d {space}", f"quota -q -g {group} {space}"]
    assert found["bytes"] == (1048576000 - 1040000000) * 1024
    if "P" in project_line:
        assert asked[2] == f"quota -q -p 4567 {space}"
        assert found["inodes"] == 10 and found["quota"] == "-p 4567"
    else:
        assert len(asked) == 2 and found["inodes"] == 500000 - 402118
        assert found["quota"] == f"-g {group}"
    refusal, _ = check_room(estimate(sweep(2).values()), "all", {**found, "bytes": 1})
    assert "(lfs quota -" in refusal
    (tmp_path / "asked").unlink()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    room(str(scratch), user="ana", lfs=lfs)
    assert (tmp_path / "asked").read_text().split() == ["quota", "-q", "-u", "ana", str(scratch)]
