"""The workflow's plan in-process (cifarflow/controller/workflow.py), as common.smk builds it: each
segment job's command line (the same as a pack member's), requests (autosize, a retry after
out of memory, a pack's memory per core), Slurm placement, the runs file, the check against
the cluster's limits, the jobs' command. No Snakemake runs here."""

import copy
import os
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from cifarflow.config import data_identity
import yaml

from conftest import ROOT
from cifarflow.job import tries
from cifarflow.controller.wheelhouse import WheelhouseError
from cifarflow.cli import parser
from cifarflow.config import with_defaults
from cifarflow.layout import (RunPaths, attempt_log_name, attempt_logs_pattern, attempt_number,
                              attempt_log_sink)
from cifarflow.job.members import next_attempt
from cifarflow.orders import PackOrder, SegmentOrder
from cifarflow.controller.packs import mem_per_cpu
from cifarflow.controller.plan import PlanError
from cifarflow.controller.software import fetch_args, installed_command
from cifarflow.controller.partitions import read_partitions
from cifarflow.controller.placement import slurm_placement
from cifarflow.controller.specs import write_specs
from cifarflow.controller.workflow import WorkflowPlan
from cifarflow.slurm import fields

BASE = with_defaults(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
NO_SLURM_ENV = {}  # placement from the config alone


class Log:
    def __init__(self):
        self.infos, self.warnings = [], []

    def info(self, line):
        self.infos.append(line)

    def warning(self, line):
        self.warnings.append(line)


class Pending(Exception):
    """Snakemake's IncompleteCheckpointException, as the workflow hands it in."""


class Checkpoints:
    """Snakemake's `checkpoints` as segment_output asks it: a segment's output once it ran."""

    def __init__(self, results):
        self.results = results

    def __getattr__(self, rule):
        def get(run=None, pack=None, segment=None):
            path = Path(RunPaths(self.results, run).segment(segment)) if run else \
                Path(self.results, "packs", pack, f"segment-{segment}.json")
            if not path.exists():
                raise Pending(path)
            return SimpleNamespace(output=SimpleNamespace(ckpt=str(path)))

        return SimpleNamespace(get=get)


def config(tmp_path, **over):
    cfg = copy.deepcopy(BASE)
    cfg["results"] = str(tmp_path / "results")
    for key, value in over.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and key != "sweep" else value
    return cfg


@pytest.fixture
def bin_dir(tmp_path):
    """An environment's bin directory with this project's command in it."""
    d = tmp_path / "bin"
    d.mkdir()
    (d / "cifarflow").write_text("#!/bin/sh\n")
    return d


def make_plan(tmp_path, bin_dir, jobs_at_once=None, environ=NO_SLURM_ENV, **over):
    cfg = config(tmp_path, **over)
    return WorkflowPlan.from_config(cfg, ROOT, checkpoints=Checkpoints(cfg["results"]),
                                    pending=Pending, log=Log(), jobs_at_once=jobs_at_once,
                                    environ=environ, scripts_dir=str(bin_dir))


def specs_written(plan):
    """The main process writes the plan's run specs (specs.py)."""
    write_specs(plan.runs.values(), plan.results, plan.log)
    return plan


def wildcards(**kw):
    return SimpleNamespace(**{k: str(v) for k, v in kw.items()})


def resources(**kw):
    return SimpleNamespace(**kw)


@pytest.mark.parametrize("k", [1, 2])
def test_a_segment_job_and_a_pack_member_run_the_same_command(tmp_path, bin_dir, k):
    plan = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]},
                     segments={"count": 2}, train={"epochs": 4})
    run = plan.runs["cpu_lr0p2"]
    params = SimpleNamespace(prologue="", launch="", cifarflow="cifarflow",
                             args=plan.run_rules.args(wildcards(run=run.name, segment=k)))
    command = plan.run_rules.command.format(  # as Snakemake fills the rule's shell in
        params=params, resources=resources(cpus_per_task=2, runtime=30, mem_mb=4000, attempt=3))
    assert command.split()[:2] == ["cifarflow", "train"]
    order = SegmentOrder.from_args(parser().parse_args(command.split()[1:]))
    member = PackOrder(pack="cpu-pack001", segment=k, results=plan.results, data=plan.batches,
                       until_epoch=run.until_epoch(k), stage_data=plan.config["data"]["stage"],
                       threads=2, budget_min=30, mem_per_cpu=2000).member(run.name, 3)
    assert order == member  # one order, whoever sends it
    paths = RunPaths(plan.results, run.name)
    assert (order.spec, order.out, order.work, order.tensorboard) == \
        (paths.spec, paths.segment(k), paths.work, paths.tensorboard)
    assert order.resume == (paths.segment(1) if k == 2 else None)
    assert (order.until_epoch, order.threads, order.budget_min, order.mem_mb,
            order.attempt) == (2 * k, 2, 30.0, 4000, 3)


def test_a_cancelled_job_names_the_runs_it_trains(tmp_path, bin_dir):
    """What a job cancelled from outside is recorded with (snakemake_fixes hands its
    wildcards): its run, or every member of its pack's segment, started or not."""
    plan = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2, 0.3]}, pack={"runs_per_job": 2})
    assert plan.runs_of({"run": "cpu_lr0p2", "segment": "1"}) == ["cpu_lr0p2"]
    assert plan.runs_of({"pack": "cpu-pack001", "segment": "1"}) == plan.packs["cpu-pack001"].members
    assert len(plan.packs["cpu-pack001"].members) == 2
    assert plan.runs_of({}) == []  # the environment record trains none


def test_a_pack_job_command_is_what_train_pack_reads(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2, 0.3]}, pack={"runs_per_job": 2})
    assert sorted(plan.packs) == ["cpu-pack001", "cpu-pack002"] and plan.packed == ["cpu"]
    assert plan.unpacked == []
    w = wildcards(pack="cpu-pack001", segment=1)
    res = plan.pack_rules.resources("cpu")
    params = SimpleNamespace(prologue="", cifarflow="cifarflow", args=plan.pack_rules.args("cpu")(w))
    command = plan.pack_rules.command("cpu").format(
        params=params, resources=resources(cpus_per_task=2, runtime=30, mem_mb_per_cpu=2000),
        threads=4, output=SimpleNamespace(record="rec.json"))
    assert command.split()[0] == "cifarflow"
    parsed = parser().parse_args(command.split()[1:])
    assert parsed.command == "train-pack"
    assert parsed.members == ["cpu_lr0p1", "cpu_lr0p2"]
    assert (parsed.pack, parsed.segment, parsed.results, parsed.data) == \
        ("cpu-pack001", 1, plan.results, plan.batches)
    assert (parsed.threads, parsed.budget_min, parsed.mem_per_cpu, parsed.slots, parsed.gpus,
            parsed.record) == (2, 30.0, 2000, 4, 0, "rec.json")
    assert res["tasks"](w) == 2 and res["mpi"](w) == "srun" and plan.pack_rules.threads("cpu")(w) == 4
    assert res["tasks"](wildcards(pack="cpu-pack002", segment=1)) == 1
    assert res["mpi"](wildcards(pack="cpu-pack002", segment=1)) == ""


def test_a_pack_asks_memory_per_core_rounded_up(tmp_path, bin_dir):
    assert mem_per_cpu(4000, 3) == 1334 and mem_per_cpu(4000, 2) == 2000
    plan = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]}, pack={"runs_per_job": 2},
                     resources={"mem_mb": 1000, "cpus_per_task": 3})
    res = plan.pack_rules.resources("cpu")
    w = wildcards(pack="cpu-pack001", segment=1)
    assert res["cpus_per_task"](w) == 3
    assert res["mem_mb_per_cpu"](w, None, 1) == 334
    assert res["runtime"](w, None, 1) == plan.config["resources"]["runtime"]


def write_segment(paths: RunPaths, k, epoch, peak_mb, wall_s):
    d = Path(paths.segment(k))
    d.mkdir(parents=True)
    history = [{"segment": f"segment-{k}", "wall_s": wall_s, "epoch": epoch,
                "peak_rss_mb": peak_mb, "peak_rss_mb_per_node": {"n1": peak_mb}}]
    (d / "checkpoint.json").write_text(json.dumps({"epoch": epoch, "segment_runs": history}))
    return str(d)


def test_autosize_sizes_segment_2_from_segment_1_and_says_so_once(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, train={"epochs": 4}, segments={"count": 2},
                     resources={"autosize": True, "mem_mb": 4000, "runtime": 60,
                                "autosize_margin": 1.5})
    previous = write_segment(RunPaths(plan.results, "cpu"), 1, 2, peak_mb=1000, wall_s=120)
    res = plan.run_rules.resources("cpu")
    w = wildcards(run="cpu", segment=2)
    given = SimpleNamespace(previous=previous)
    assert res["mem_mb"](w, given, 1) == 1500  # 1000 MB x 1.5
    assert res["runtime"](w, given, 1) < 60
    assert res["mem_mb"](wildcards(run="cpu", segment=1), SimpleNamespace(), 1) == 4000
    res["mem_mb"](w, given, 1)
    assert len([line for line in plan.log.infos if line.startswith("cpu segment 2: autosize")]) == 1


def test_a_retry_after_out_of_memory_asks_more(tmp_path, bin_dir, monkeypatch):
    monkeypatch.setenv(tries.INVOCATION, "now")
    for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "SLURM_JOB_ID", "CIFARFLOW_SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    plan = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]}, pack={"runs_per_job": 2},
                     resources={"mem_mb": 1000, "cpus_per_task": 2, "oom_factor": 2})
    root = RunPaths(plan.results, "cpu_lr0p2").root
    tries.record(root, 1, 1, "start")
    tries.record(root, 1, 1, "end", ended=tries.OUT_OF_MEMORY)
    unpacked = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]},
                         resources={"mem_mb": 1000, "cpus_per_task": 2, "oom_factor": 2})
    mem = unpacked.run_rules.resources("cpu")["mem_mb"]
    assert mem(wildcards(run="cpu_lr0p2", segment=1), SimpleNamespace(), 1) == 1000  # a first try
    assert mem(wildcards(run="cpu_lr0p2", segment=1), SimpleNamespace(), 2) == 2000
    assert mem(wildcards(run="cpu_lr0p1", segment=1), SimpleNamespace(), 2) == 1000
    per_cpu = plan.pack_rules.resources("cpu")["mem_mb_per_cpu"]  # a pack: its hungriest member
    assert per_cpu(wildcards(pack="cpu-pack001", segment=1), None, 2) == 1000


def test_slurm_placement_from_the_config_else_the_environment(tmp_path, bin_dir):
    slurm = {"account": "", "partition": "", "extra": ""}
    assert slurm_placement(slurm, {}) == {}
    env = {"SLURM_ACCOUNT": "def-pi", "SLURM_PARTITION": "short"}
    assert slurm_placement(slurm, env) == {"slurm_account": "def-pi", "slurm_partition": "short"}
    mine = {"account": "def-me", "partition": "", "extra": "--qos=high"}
    assert slurm_placement(mine, env) == {"slurm_account": "def-me", "slurm_partition": "short",
                                          "slurm_extra": "--qos=high"}
    plan = make_plan(tmp_path, bin_dir, environ=env, sweep={"lr": [0.1, 0.2]},
                     pack={"runs_per_job": 2})
    assert plan.run_rules.resources("cpu")["slurm_account"] == "def-pi"
    assert plan.pack_rules.resources("cpu")["slurm_partition"] == "short"


def test_a_cpu_pack_asks_one_node_unless_it_may_spread_and_a_whole_node_alone(tmp_path, bin_dir):
    """pack.nodes 1 (default) asks --nodes=1; any leaves the nodes to Slurm; pack.whole_node
    adds --exclusive to slurm.extra's options; whole_node with nodes any is refused."""
    pack = {"runs_per_job": 2}
    one = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]}, pack=pack)
    res = one.pack_rules.resources("cpu")
    assert res["nodes"] == 1 and "slurm_extra" not in res
    spread = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]}, pack={**pack, "nodes": "any"})
    assert "nodes" not in spread.pack_rules.resources("cpu")
    assert "nodes" not in spread.run_rules.resources("cpu")  # runs alone: as before
    whole = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]},
                      pack={**pack, "whole_node": True},
                      slurm={"account": "", "partition": "", "extra": "--qos=high"})
    res = whole.pack_rules.resources("cpu")
    assert (res["nodes"], res["slurm_extra"]) == (1, "--exclusive --qos=high")
    assert whole.run_rules.resources("cpu")["slurm_extra"] == "--qos=high"
    with pytest.raises(PlanError, match="pack.whole_node: true holds one whole node per pack "
                                        "job: set pack.nodes: 1"):
        make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]},
                  pack={**pack, "whole_node": True, "nodes": "any"})


def test_a_rule_attribute_is_one_value_where_the_runs_share_it(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, sweep={"cpus_per_task": [1, 4], "lr": [0.1]})
    threads = plan.run_rules.threads("cpu")
    assert threads(wildcards(run="cpu_cpus4_lr0p1")) == 4
    assert threads(wildcards(run="cpu_cpus1_lr0p1")) == 1
    assert make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]}).run_rules.threads("cpu") == 2


def test_the_runs_file_says_what_aggregation_needs(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]}, segments={"count": 2},
                     train={"epochs": 4})
    for k in (2, 10):
        d = Path(RunPaths(plan.results, "cpu_lr0p1").segment(k))
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("{}\n")
    found = plan.outputs.existing_metrics()
    assert found == {"cpu_lr0p1": f"{plan.results}/runs/cpu_lr0p1/segment-10/metrics.jsonl"}
    out = tmp_path / "out" / "runs.json"
    plan.outputs.write_runs_file(found, out)
    runs = json.loads(out.read_text())
    assert sorted(runs) == ["cpu_lr0p1", "cpu_lr0p2"]
    first = runs["cpu_lr0p1"]
    assert first["segments"] == 10 and first["metrics"] == found["cpu_lr0p1"]
    assert first["strategy"] == "cpu" and first["swept"] == {"lr": 0.1}
    assert first["planned_segments"] == 2 and first["pruned_at"] is None
    assert first["logs"] == f"{plan.results}/logs/train/cpu_lr0p1"
    assert first["spec"]["lr"] == 0.1 and first["resources"]["cpus_per_task"] == 2
    assert runs["cpu_lr0p2"]["metrics"] is None and runs["cpu_lr0p2"]["segments"] is None


def test_segment_output_waits_for_the_run_s_own_job_or_its_pack_s(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2, 0.3]}, pack={"runs_per_job": 2},
                     strategies=["cpu", "ddp"])
    with pytest.raises(Pending):
        plan.outputs.segment_output("cpu_lr0p1", 1)
    marker = Path(plan.results, "packs", "cpu-pack001", "segment-1.json")
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    assert plan.outputs.segment_output("cpu_lr0p2", 1) == RunPaths(plan.results, "cpu_lr0p2").segment(1)
    with pytest.raises(Pending):
        plan.outputs.segment_output("ddp_lr0p1", 1)


LIMITS = {"max_job_count": "10000", "max_array_size": "1001", "accounting": True,
          "max_submit": 3}
SHORT = ("PartitionName=short Default=NO Hidden=NO State=UP MaxTime=00:05:00 Nodes=vm\n"
         "PartitionName=long Default=NO Hidden=NO State=UP MaxTime=1-00:00:00 Nodes=vm")
VM = "NodeName=vm CPUTot=8 RealMemory=22900 Gres=(null)"
ROOM = {"path": "/big", "bytes": 10**15, "inodes": 10**9, "quota": False}


def short_cluster(kind):
    return [fields(line) for line in (SHORT if kind == "partition" else VM).splitlines()]


def test_the_cluster_check_refuses_a_runtime_above_maxtime_under_jobs(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, jobs_at_once=2, sweep={"lr": [0.1, 0.2, 0.3, 0.4]},
                     pack={"runs_per_job": 2}, strategies=["cpu", "ddp"],
                     segments={"count": 2}, train={"epochs": 4}, slurm={"partition": "short"})
    with pytest.raises(PlanError) as refused:
        plan.checks.against_cluster(lambda results: ROOM, limits_of=lambda: LIMITS,
                                   partitions_of=lambda: read_partitions(short_cluster),
                                   accounts_of=lambda user: None)
    assert "resources.runtime 30 min of pack cpu-pack001 (2 runs) (and 1 more alike)" \
        in str(refused.value)
    assert "above partition short's MaxTime of 5 min" in str(refused.value)
    # 2 packs of cpu + 4 ddp runs = 6 jobs a round, 2 rounds
    assert plan.log.infos[0] == ("plan: 6 segment job(s) per round, 2 round(s), 12 segment "
                                 "job(s) in all, at most 2 queued at once (--jobs)")
    assert "pack.runs_per_job: 3 would submit a round at once" in plan.log.infos[1]
    assert plan.log.infos[2].startswith("cluster limits: MaxJobCount 10000")
    assert plan.log.infos[3] == "partitions: every job to partition short (short MaxTime 5 min)"


def test_the_cluster_check_only_warns_without_jobs_and_says_when_there_is_no_slurm(
        tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, slurm={"partition": "short"})
    plan.checks.against_cluster(lambda results: ROOM, limits_of=lambda: LIMITS,
                               partitions_of=lambda: read_partitions(short_cluster),
                               accounts_of=lambda user: None)
    assert len(plan.log.warnings) == 1
    assert plan.log.warnings[0].endswith("(a run through profiles/slurm stops here)")
    assert plan.log.infos[-1].startswith("slurm account: sacctmgr does not answer here")
    quiet = make_plan(tmp_path, bin_dir, jobs_at_once=4)
    quiet.checks.against_cluster(lambda results: ROOM, limits_of=lambda: None,
                                partitions_of=lambda: pytest.fail(
                                    "asked for the partitions after Slurm did not answer"))
    assert quiet.log.infos == [
        "plan: 1 segment job(s) per round, 2 round(s), 2 segment job(s) in all, at most 4 "
        "queued at once (--jobs)",
        "cluster limits: no answer from Slurm here (scontrol show config); the plan is not "
        "checked against a cluster"]


def test_the_plan_says_how_it_packs_and_prunes(tmp_path, bin_dir):
    prune = {"at_segments": [1], "metric": "test_acc", "keep": 0.5, "min_runs": 1}
    plan = make_plan(tmp_path, bin_dir, strategies=["cpu", "ddp"], pack={"runs_per_job": 4},
                     sweep={"lr": [0.1, 0.2, 0.3], "prune": prune},
                     segments={"count": 2}, train={"epochs": 4})
    plan.announce()
    assert plan.log.infos[0].startswith("sweep.prune: the runs of each strategy are ranked on")
    assert plan.log.infos[1] == ("pack: 3 runs of cpu in 1 packs of up to 4, one job per pack "
                                 "and segment; ddp (several processes per run): one job per "
                                 "run and segment; each pack job on one node (pack.nodes: 1)")


def test_specs_are_written_only_when_they_change(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, sweep={"lr": [0.1, 0.2]})
    specs_written(plan)
    spec = Path(RunPaths(plan.results, "cpu_lr0p1").spec)
    assert json.loads(spec.read_text())["lr"] == 0.1
    before = spec.stat().st_mtime_ns
    specs_written(plan)
    assert spec.stat().st_mtime_ns == before


def test_a_config_error_and_a_missing_command_are_one_error(tmp_path, bin_dir):
    with pytest.raises(PlanError, match="config error: unknown strategy 'nope'"):
        make_plan(tmp_path, bin_dir, strategies=["nope"])
    with pytest.raises(PlanError, match="cifarflow not found: install this project"):
        installed_command(tmp_path / "empty", ROOT)
    with pytest.raises(PlanError, match=f"{tmp_path}/venv/bin/cifarflow not found"):
        make_plan(tmp_path, bin_dir, env={"mode": "venv", "venv": str(tmp_path / "venv")})


def test_the_job_command_follows_env_mode(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir)
    assert plan.software.cifarflow == plan.software.job_cifarflow == str(bin_dir / "cifarflow")
    assert make_plan(tmp_path, bin_dir, env={"mode": "slurm_tmpdir"}).software.job_cifarflow == \
        "python -m cifarflow"
    venv = make_plan(tmp_path, bin_dir, env={"mode": "venv", "venv": str(tmp_path)})
    assert venv.software.job_cifarflow == "cifarflow" and venv.software.python == "python"


def test_only_gpu_runs_ask_the_environment_check_for_a_gpu(tmp_path, bin_dir):
    assert make_plan(tmp_path, bin_dir).software.env_gpu == {}
    gpu = make_plan(tmp_path, bin_dir, strategies=["gpu"], resources={"gpu_model": "h100"})
    assert gpu.software.env_gpu == {"gres": "gpu:h100:1", "tasks_per_gpu": 0}


def test_fetch_args_carry_the_synthetic_generator(tmp_path):
    data = {"source": "synthetic", "url": "u", "md5": "m", "archive": None,
            "synthetic": {"train_size": 10, "seed": 1}}
    assert fetch_args(data) == ("--url u --md5 m --archive '' --train-size=10 --seed=1 "
                                f"--data-id {data_identity(data)}")
    assert data_identity(data).startswith("synthetic-")


def test_every_try_s_log_has_one_name_in_the_shell_and_in_python(tmp_path):
    assert attempt_log_name("segment-3", 2) == "segment-3.attempt2.log"
    assert attempt_log_name("segment-3", 2, 1) == "segment-3.attempt2.requeue1.log"
    assert attempt_number("segment-3.attempt12.requeue1.log") == 12
    assert RunPaths("r", "x").attempt_log(3, 2) == "r/logs/train/x/segment-3.attempt2.log"
    for requeue in (0, 2):
        log = tmp_path / f"segment-3-{requeue}.log"
        log.write_text("an earlier try's copy")  # a log of before: replaced by the link
        shell = attempt_log_sink().format(log=log, resources=SimpleNamespace(attempt=4))
        subprocess.run(["bash", "-c", f"echo trained | {shell}"], check=True,
                       env={"CIFARFLOW_SLURM_RESTART_COUNT": str(requeue), "PATH": "/usr/bin:/bin"})
        kept = tmp_path / attempt_log_name(log.stem, 4, requeue)
        assert kept.read_text() == log.read_text() == "trained\n"
        assert log.is_symlink() and os.readlink(log) == kept.name  # one file, one link
    assert sorted(p.name for p in tmp_path.glob(attempt_logs_pattern("segment-3-2", 4))) == \
        ["segment-3-2.attempt4.requeue2.log"]


def test_a_pack_member_s_next_try_follows_its_logs(tmp_path):
    paths = RunPaths(str(tmp_path), "cpu")
    assert next_attempt(paths, 1) == 1
    Path(paths.logs).mkdir(parents=True)
    for name in ("segment-1.attempt1.log", "segment-1.attempt2.requeue1.log",
                 "segment-2.attempt5.log", "segment-1.log"):
        Path(paths.logs, name).write_text("")
    assert next_attempt(paths, 1) == 3 and next_attempt(paths, 2) == 6


def test_a_fused_pack_is_one_task_with_the_members_memory_and_one_gpu(tmp_path, bin_dir):
    """pack.fuse: the job trains its members in one process: one task of a member's cores,
    one member's memory and a share per further member (1000 + 2 x 250 MB), one GPU; its
    command line says --fuse; the plan says how the sweep fused, in one line."""
    plan = make_plan(tmp_path, bin_dir, strategies=["gpu"], sweep={"lr": [0.1, 0.2, 0.3]},
                     pack={"runs_per_job": 3, "fuse": True},
                     resources={"mem_mb": 1000, "cpus_per_task": 2})
    assert [(p.members, p.fuse) for p in plan.packs.values()] == [
        (["gpu_lr0p1", "gpu_lr0p2", "gpu_lr0p3"], "auto")]
    w = wildcards(pack="gpu-pack001", segment=1)
    res = plan.pack_rules.resources("gpu")
    assert (res["tasks"](w), res["cpus_per_task"](w), res["mem_mb_per_cpu"](w, None, 1),
            res["slurm_extra"](w), res["mpi"](w)) == (1, 2, 750, "--gpus-per-node=1", "")
    assert plan.pack_rules.threads("gpu")(w) == 2
    parsed = parser().parse_args(["train-pack", *plan.pack_rules.args("gpu")(w).split(), "--threads",
                                  "2", "--budget-min", "30", "--mem-per-cpu", "1500",
                                  "--record", "r.json"])
    assert parsed.fuse == "auto" and parsed.members == ["gpu_lr0p1", "gpu_lr0p2", "gpu_lr0p3"]
    plan.announce()
    assert plan.log.infos[-3] == "pack.fuse: 3 runs in 1 fused pack(s) (lenet bs 512: 1)"
    assert plan.log.infos[-2].startswith("storage: 3 run(s) will hold ~127 files and 24 folders")
    assert plan.log.infos[-1].startswith("train.checkpoint_interval_s auto: in-segment "
                                         "checkpoints every 300 s")


def test_a_fused_pack_asks_what_its_one_process_needs_then_what_it_measured(tmp_path, bin_dir):
    """32 lenet members of 4,000 MB asked 128,000 MB in one process (more than a GPU's share
    of a node); now 4,000 + 31 x 250. With autosize, segment 2 asks the fused process's
    measured peak x the margin (every member records that one process's peak), not x 32."""
    lrs = [round(0.01 * (i + 1), 2) for i in range(32)]
    plan = make_plan(tmp_path, bin_dir, strategies=["gpu"], sweep={"lr": lrs},
                     segments={"count": 2}, train={"epochs": 2},
                     pack={"runs_per_job": 32, "fuse": True},
                     resources={"mem_mb": 4000, "cpus_per_task": 1, "autosize": True})
    (pack,) = plan.packs.values()
    res = plan.pack_rules.resources("gpu")
    first = wildcards(pack=pack.name, segment=1)
    assert res["mem_mb_per_cpu"](first, None, 1) == 4000 + 31 * 250
    assert plan.pack_rules.request(first, 1).mem_mb == 11750
    for run in pack.members:  # segment 1 as the fused process recorded it: 3,000 MB each
        seg = Path(RunPaths(str(tmp_path / "results"), run).segment(1))
        seg.mkdir(parents=True)
        (seg / "checkpoint.json").write_text(json.dumps({"epoch": 1, "segment_runs": [
            {"segment": "segment-1", "wall_s": 60, "epoch": 1, "peak_rss_mb": 3000,
             "peak_rss_mb_per_node": {"n1": 3000}}]}))
        (seg / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "wall_s": 60}) + "\n")
    second = wildcards(pack=pack.name, segment=2)
    assert plan.pack_rules.request(second, 1).mem_mb == 3900  # 3,000 x 1.3, the whole process
    assert res["mem_mb_per_cpu"](second, None, 1) == 3900


@pytest.mark.parametrize("elastic", [True, False])
def test_a_new_world_size_keeps_the_finished_segments_only_when_elastic(tmp_path, bin_dir,
                                                                       elastic):
    """The spec's time stamp is what makes Snakemake train a run's segments again: a new
    distributed.world_size under segments.elastic keeps it (the next segment resumes from
    the finished ones), and without the flag the plan says the run starts over."""
    over = dict(strategies=["ddp"], distributed={"world_size": 1},
                segments={"count": 2, "elastic": elastic})
    specs_written(make_plan(tmp_path, bin_dir, **over))
    spec = Path(RunPaths(str(tmp_path / "results"), "ddp").spec)
    old = spec.stat().st_mtime_ns - 10**9  # as if written a second ago
    os.utime(spec, ns=(old, old))
    plan = make_plan(tmp_path, bin_dir, **{**over, "distributed": {"world_size": 2}})
    specs_written(plan)
    assert json.loads(spec.read_text())["world_size"] == 2  # the next segment's world
    said = [line for line in plan.log.infos if line.startswith("run ddp: world size 1 -> 2")]
    if elastic:
        assert spec.stat().st_mtime_ns == old
        assert said == ["run ddp: world size 1 -> 2 (segments.elastic): its finished segments "
                        "stand, the next resumes from them at an epoch boundary"]
    else:
        assert spec.stat().st_mtime_ns > old
        assert said == ["run ddp: world size 1 -> 2: the run is trained again from its first "
                        "segment (segments.elastic: true would go on from the finished ones)"]


def test_a_spec_that_gains_or_changes_only_what_a_run_reports_keeps_its_time_stamp(
        tmp_path, bin_dir):
    """An upgrade that adds a reporting key (train.tensorboard) to every spec.json, or a
    user turning the curves off, retrains nothing; a shaping change still does."""
    plan = make_plan(tmp_path, bin_dir)
    specs_written(plan)
    spec = Path(RunPaths(str(tmp_path / "results"), "cpu").spec)
    written = json.loads(spec.read_text())
    del written["tensorboard"]  # a spec written before train.tensorboard existed
    spec.write_text(json.dumps(written))
    old = spec.stat().st_mtime_ns - 10**9
    os.utime(spec, ns=(old, old))
    specs_written(make_plan(tmp_path, bin_dir))
    assert json.loads(spec.read_text())["tensorboard"] is True
    assert spec.stat().st_mtime_ns == old
    specs_written(make_plan(tmp_path, bin_dir, train={"tensorboard": False}))
    assert json.loads(spec.read_text())["tensorboard"] is False
    assert spec.stat().st_mtime_ns == old
    specs_written(make_plan(tmp_path, bin_dir, train={"tensorboard": False, "lr": 0.5}))
    assert spec.stat().st_mtime_ns > old


def test_a_sweep_that_grows_changes_the_auto_checkpoint_interval_and_trains_nothing_again(
        tmp_path, bin_dir):
    """train.checkpoint_interval_s auto follows the runs at once: a resnet18 sweep grown from
    2 to 200 runs rewrites the specs with the longer interval, keeping their time stamp (a
    checkpoint is a resume point: nothing trained changes); any other change moves it; the
    plan says the interval it chose."""
    over = dict(train={"model": "resnet18", "checkpoint_interval_s": "auto"})
    specs_written(make_plan(tmp_path, bin_dir, sweep={"lr": [0.001, 0.002]}, **over))
    spec = Path(RunPaths(str(tmp_path / "results"), "cpu_lr0p001").spec)
    assert json.loads(spec.read_text())["checkpoint_interval_s"] == 300
    old = spec.stat().st_mtime_ns - 10**9  # as if written a second ago
    os.utime(spec, ns=(old, old))
    grown = make_plan(tmp_path, bin_dir, sweep={"lr": [0.001 * (i + 1) for i in range(200)]},
                      **over)
    specs_written(grown)
    assert json.loads(spec.read_text())["checkpoint_interval_s"] == pytest.approx(715, abs=1)
    assert spec.stat().st_mtime_ns == old
    grown.announce()
    assert ("train.checkpoint_interval_s auto: in-segment checkpoints every 715 s (300 for a "
            "run alone, longer where many train at once, so that together they write at most "
            "~25 MB/s on average; docs/segments.md)") in grown.log.infos
    specs_written(make_plan(tmp_path, bin_dir, sweep={"lr": [0.001 * (i + 1) for i in range(200)]},
                            train={**over["train"], "epochs": 5}))
    assert spec.stat().st_mtime_ns > old  # epochs shape the run: trained again


def test_job_venvs_install_this_venvs_training_stack_or_the_users_file(tmp_path, bin_dir):
    """env.mode slurm_tmpdir: the plan writes the job requirements (once: an unchanged file
    keeps its time stamp) and hands the wheelhouse check the jobs' index options; a refusal
    is a plan error; a named file must exist."""
    asked = []

    def check(requirements, index, checks):
        asked.append((requirements, index))
        return True

    plan = make_plan(tmp_path, bin_dir, env={"mode": "slurm_tmpdir", "find_links": "/w"})
    derived = tmp_path / "results/environment/job-requirements.txt"
    assert plan.software.job_requirements == derived
    plan.software.prepare_job_venvs(check=check)
    assert asked == [(derived, ["--no-index", "--find-links", "/w"])]
    assert "\ntorch==" in derived.read_text() and "snakemake" not in derived.read_text()
    stamp = derived.stat().st_mtime_ns
    plan.software.prepare_job_venvs(check=check)
    assert derived.stat().st_mtime_ns == stamp
    assert "job venvs install" in " ".join(plan.log.infos)

    def refuse(*args):
        raise WheelhouseError("pyyaml==9 (the wheelhouse has 6.0.1)")

    with pytest.raises(PlanError, match=r"pyyaml==9 \(the wheelhouse has 6.0.1\)"):
        plan.software.prepare_job_venvs(check=refuse)
    unchecked = make_plan(tmp_path, bin_dir, env={"mode": "slurm_tmpdir", "check_wheelhouse": False})
    unchecked.software.prepare_job_venvs(check=refuse)  # off: not asked
    absent = make_plan(tmp_path, bin_dir, env={"mode": "slurm_tmpdir", "requirements": "nope.txt"})
    assert absent.software.job_requirements == ROOT / "nope.txt"
    with pytest.raises(PlanError, match="env.requirements: .*nope.txt does not exist"):
        absent.software.prepare_job_venvs(check=check)
    make_plan(tmp_path, bin_dir).software.prepare_job_venvs(check=refuse)  # env.mode current: nothing


def test_a_plan_asking_two_mig_slices_per_job_is_refused_even_without_slurm(tmp_path, bin_dir):
    plan = make_plan(tmp_path, bin_dir, strategies=["ddp"],
                     distributed={"world_size": 2, "device": "cuda"},
                     resources={"gpu_model": "a100_3g.20gb"})
    with pytest.raises(PlanError, match=r"a100_3g.20gb is a MIG slice.*run ddp asks 2"):
        plan.checks.against_cluster(lambda results: ROOM, limits_of=lambda: None)
    make_plan(tmp_path, bin_dir, strategies=["gpu"], resources={"gpu_model": "a100_3g.20gb"}) \
        .checks.against_cluster(lambda results: ROOM, limits_of=lambda: None)


def test_ranks_with_a_gpu_each_are_bound_to_it_and_shared_gpus_are_not(tmp_path, bin_dir):
    def prefix(strategy, **over):
        plan = make_plan(tmp_path, bin_dir, strategies=[strategy], **over)
        return plan.run_rules.launch_prefix(strategy)

    cuda = {"distributed": {"world_size": 2, "device": "cuda"}}
    for strategy in ("ddp", "fsdp", "lightning"):
        assert "launch --cpus-per-task 2 --gpus-per-task 1" in prefix(strategy, **cuda)
    assert "--gpus-per-task 1" in prefix("gpu")
    assert "--gpus-per-task" not in prefix("mps", **cuda)  # the replicas share one GPU
    assert "--gpus-per-task" not in prefix("ddp") and "--gpus-per-task" not in prefix("cpu")


GPU_PARTITIONS = ("PartitionName=gpu Default=NO Hidden=NO State=UP MaxTime=1-00:00:00 "
                  "Nodes=g[1-2]\n"
                  "PartitionName=cpu Default=NO Hidden=NO State=UP MaxTime=1-00:00:00 Nodes=c1")
GPU_NODES = ("NodeName=g1 CPUTot=32 RealMemory=200000 Gres=gpu:h100:4(S:0-1)\n"
             "NodeName=g2 CPUTot=32 RealMemory=200000 Gres=gpu:h100:4(S:0-1)\n"
             "NodeName=c1 CPUTot=32 RealMemory=200000 Gres=(null)")


def gpu_cluster(nodes=GPU_NODES):
    return lambda kind: [fields(line) for line in
                         (GPU_PARTITIONS if kind == "partition" else nodes).splitlines()]


def test_unpacked_gpu_jobs_get_the_account_sacctmgr_settled(tmp_path, bin_dir):
    """No slurm.account, the site's def-x_cpu / def-x_gpu: a plan of GPU runs only settles
    its account on the GPU side alone; its training jobs and its environment record go there
    (they went without -A: the plugin guessed one, once def-x_cpu)."""
    plan = make_plan(tmp_path, bin_dir, jobs_at_once=2, strategies=["gpu"],
                     sweep={"lr": [0.1, 0.2]})
    plan.checks.against_cluster(lambda results: ROOM, limits_of=lambda: LIMITS,
                                partitions_of=lambda: read_partitions(gpu_cluster()),
                                accounts_of=lambda user: ["def-x_cpu", "def-x_gpu"])
    res = plan.run_rules.resources("gpu")
    assert res["slurm_account"] == "def-x_gpu"
    assert plan.placement.for_job(bool(plan.software.env_gpu))["slurm_account"] == "def-x_gpu"


def test_results_expands_the_variables_the_docs_write_or_names_the_unset_one(tmp_path, bin_dir):
    """results: /project/def-yourpi/$USER/cifar, as docs/slurm.md writes it, is the user's
    folder (a folder literally named $USER was made); ${VAR} and ~ too; a variable that is not
    set is refused, naming it."""
    env = {"USER": "ana", "SCRATCH": str(tmp_path / "scratch"), "HOME": str(tmp_path / "home")}
    plan = make_plan(tmp_path, bin_dir, environ=env, results="/project/def-yourpi/$USER/cifar")
    assert plan.results == "/project/def-yourpi/ana/cifar"
    assert plan.run_rules.order("cpu", 1).out.startswith("/project/def-yourpi/ana/cifar/")
    assert make_plan(tmp_path, bin_dir, environ=env,
                     results="${SCRATCH}/sweep").results == f"{tmp_path}/scratch/sweep"
    assert make_plan(tmp_path, bin_dir, environ=env, results="~/r").results == \
        f"{tmp_path}/home/r"
    with pytest.raises(PlanError, match=r"results: /project/\$PI/x names \$PI, which is not "
                                        r"set here"):
        make_plan(tmp_path, bin_dir, environ=env, results="/project/$PI/x")


def test_a_slurm_run_on_synthetic_data_is_warned_about_at_dry_run(tmp_path, bin_dir):
    """The default data.source synthetic under profiles/slurm (--jobs) or controller-job (in
    a Slurm job): a WARNING naming data.source download and the data step; none for a local
    run (the demo) or with real data."""
    slurm = make_plan(tmp_path, bin_dir, jobs_at_once=4)
    slurm.checks.kept_data(environ={})
    assert len(slurm.log.warnings) == 1
    assert slurm.log.warnings[0].startswith("WARNING: data.source synthetic: every run trains "
                                            "on generated images")
    assert "data.source: download" in slurm.log.warnings[0]
    assert "snakemake --profile profiles/slurm extract_dataset" in slurm.log.warnings[0]
    in_job = make_plan(tmp_path, bin_dir)
    in_job.checks.kept_data(environ={"SLURM_JOB_ID": "7"})
    assert len(in_job.log.warnings) == 1
    local = make_plan(tmp_path, bin_dir)
    local.checks.kept_data(environ={})
    real = make_plan(tmp_path, bin_dir, jobs_at_once=4, data={"source": "download"})
    real.checks.kept_data(environ={})
    assert local.log.warnings == real.log.warnings == []


def checked(plan, nodes=GPU_NODES):
    plan.checks.against_cluster(lambda results: ROOM, limits_of=lambda: LIMITS,
                                partitions_of=lambda: read_partitions(gpu_cluster(nodes)),
                                accounts_of=lambda user: None)
    return plan


def test_gpu_requests_are_typed_with_the_nodes_type_unless_gpu_model_is_any(tmp_path, bin_dir):
    """resources.gpu_model unset: every GPU job (a run's, a pack's, the environment record's)
    asks for the type the nodes have, as Alliance documents it (--gpus-per-node=h100:1, no
    --gres), and -n says so; `any` asks untyped; of several types the whole-GPU type with the
    most GPUs is chosen and named; a named type the nodes lack is still refused."""
    plan = checked(make_plan(tmp_path, bin_dir, jobs_at_once=2, strategies=["gpu"]))
    res = plan.run_rules.resources("gpu")
    assert res["slurm_extra"] == "--gpus-per-node=h100:1" and "gres" not in res
    assert plan.placement.job(plan.software.env_gpu)["slurm_extra"] == "--gpus-per-node=h100:1"
    assert ("GPU type: h100 (the type of the GPU nodes: h100:8): GPU jobs ask "
            "--gpus-per-node=h100:<n>; resources.gpu_model names another type, any asks for "
            "any") in plan.log.infos
    packed = checked(make_plan(tmp_path, bin_dir, jobs_at_once=2, strategies=["gpu"],
                               sweep={"lr": [0.1, 0.2]}, pack={"runs_per_job": 2}))
    w = wildcards(pack="gpu-pack001", segment=1)
    assert packed.pack_rules.resources("gpu")["slurm_extra"](w) == "--gpus-per-node=h100:2"
    untyped = checked(make_plan(tmp_path, bin_dir, jobs_at_once=2, strategies=["gpu"],
                                resources={"gpu_model": "any"}))
    assert untyped.run_rules.resources("gpu")["slurm_extra"] == "--gpus-per-node=1"
    mixed = GPU_NODES.replace("g2 CPUTot=32 RealMemory=200000 Gres=gpu:h100:4(S:0-1)",
                              "g2 CPUTot=32 RealMemory=200000 Gres=gpu:a100:2,"
                              "gpu:a100_1g.5gb:14")
    chosen = checked(make_plan(tmp_path, bin_dir, jobs_at_once=2, strategies=["gpu"]), mixed)
    assert chosen.run_rules.resources("gpu")["slurm_extra"] == "--gpus-per-node=h100:1"
    assert any(line.startswith("GPU type: h100 (of several, the whole-GPU type with the most "
                               "GPUs where GPU jobs go: a100_1g.5gb:14, h100:4, a100:2)")
               for line in chosen.log.infos)
    with pytest.raises(PlanError, match="resources.gpu_model v100 is on no node"):
        checked(make_plan(tmp_path, bin_dir, jobs_at_once=2, strategies=["gpu"],
                          resources={"gpu_model": "v100"}))
