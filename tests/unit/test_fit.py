"""Jobs that can never start: the plan's job shapes against what a partition can ever give
(parsed real `scontrol -o show partition/node` output of the test cluster), and the pending
reasons the controller names (real `squeue` lines)."""

import pytest

from cifarflow.config import with_defaults
from cifarflow.controller.gpu_limits import gpu_share_warnings, gpu_slice_errors
from cifarflow.controller.partitions import expand_hostlist, partition_capacity
from cifarflow.controller.routing import candidates, check_fit, whole_node_notes
from cifarflow.controller.pending import PendingWatch, stuck_jobs
from cifarflow.slurm import fields
from cifarflow.controller.pack_plan import build_packs, plan_packs, share_gpus
from cifarflow.controller.plan import build_runs
from cifarflow.controller.packs import job_shapes

PARTITIONS = """\
PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=20 Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=vm PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=REQUEUE State=UP TotalCPUs=2 TotalNodes=1 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=2,mem=22900M,node=1,billing=2
PartitionName=multi AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=n[1-2] PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=REQUEUE State=UP TotalCPUs=4 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=4,mem=45800M,node=2,billing=4
"""
NODES = """\
NodeName=vm Arch=x86_64 CoresPerSocket=2  CPUAlloc=2 CPUEfctv=2 CPUTot=2 CPULoad=7.88 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.77.0.1 NodeHostName=vm Version=22.05.8 RealMemory=22900 AllocMem=3000 FreeMem=18821 Sockets=1 Boards=1 State=ALLOCATED ThreadsPerCore=1 TmpDisk=0 Weight=1 Partitions=debug,urgent,short CfgTRES=cpu=2,mem=22900M,billing=2
NodeName=n1 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=7.86 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=10.77.0.11 NodeHostName=n1 Version=22.05.8 RealMemory=22900 AllocMem=0 FreeMem=19678 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Partitions=multi CfgTRES=cpu=2,mem=22900M,billing=2
NodeName=n2 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=7.86 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=10.77.0.12 NodeHostName=n2 Version=22.05.8 RealMemory=22900 AllocMem=0 FreeMem=19678 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Partitions=multi CfgTRES=cpu=2,mem=22900M,billing=2
"""


def partitions():
    nodes = [fields(line) for line in NODES.splitlines()]
    found = {p["PartitionName"]: partition_capacity(p, nodes)
             for p in map(fields, PARTITIONS.splitlines())}
    return found  # debug is Default=YES: a job naming none goes there


def plan(**config):
    config = with_defaults(config)
    runs = build_runs(config)
    return job_shapes(runs, plan_packs(runs, config["pack"]))


def test_host_lists_and_capacities():
    assert expand_hostlist("n[1-3,05],vm") == ["n1", "n2", "n3", "n05", "vm"]
    multi = partitions()["multi"]
    assert [(n["name"], n["cpus"], n["mem_mb"], n["gpus"]) for n in multi["nodes"]] == [
        ("n1", 2, 22900, 2), ("n2", 2, 22900, 2)]


def test_a_pack_wider_than_the_partition_is_one_error_with_the_way_out():
    shapes = plan(strategies=["cpu"], resources={"cpus_per_task": 1, "mem_mb": 1000},
                  sweep={"lr": [0.01 * i for i in range(1, 9)]}, pack={"runs_per_job": 8})
    assert check_fit(shapes, "", partitions()) == [
        "pack cpu-pack001 (8 runs) asks 8 task(s) of 1 CPU(s), on 1 node(s), 1000 MB per CPU, "
        "and partition debug can ever give one job 2 such task(s) (1 node(s): vm 2 CPUs 22900 "
        "MB): it would wait forever; set pack.runs_per_job: 2, or another partition"]
    four = plan(strategies=["cpu"], resources={"cpus_per_task": 1, "mem_mb": 1000},
                sweep={"lr": [0.01 * i for i in range(1, 5)]},
                pack={"runs_per_job": 4, "nodes": "any"})
    assert check_fit(four, "multi", partitions()) == []  # 2 nodes x 2 CPUs
    assert "slurm.partition: multi (it fits there)" in check_fit(four, "debug", partitions())[0]


def test_a_cpu_pack_asks_one_node_and_a_wider_one_is_refused_with_both_ways_out():
    """pack.nodes 1 (the default): 4 one-core members do not fit one 2-core node of multi;
    the error names the pack size that fits and pack.nodes: any, which fits there."""
    four = plan(strategies=["cpu"], resources={"cpus_per_task": 1, "mem_mb": 1000},
                sweep={"lr": [0.01 * i for i in range(1, 5)]}, pack={"runs_per_job": 4})
    assert four["pack cpu-pack001 (4 runs)"]["nodes"] == 1
    assert check_fit(four, "multi", partitions()) == [
        "pack cpu-pack001 (4 runs) asks 4 task(s) of 1 CPU(s), on 1 node(s), 1000 MB per CPU, "
        "and partition multi can ever give one job 2 such task(s) (2 node(s): n1 2 CPUs 22900 "
        "MB 2 GPUs, n2 2 CPUs 22900 MB 2 GPUs): it would wait forever; set pack.runs_per_job: "
        "2, or pack.nodes: any (Slurm spreads the members over nodes), or another partition"]
    two = plan(strategies=["cpu"], resources={"cpus_per_task": 1, "mem_mb": 1000},
               sweep={"lr": [0.01 * i for i in range(1, 5)]}, pack={"runs_per_job": 2})
    assert check_fit(two, "multi", partitions()) == check_fit(two, "debug", partitions()) == []
    spread = plan(strategies=["cpu"], resources={"cpus_per_task": 1, "mem_mb": 1000},
                  sweep={"lr": [0.01 * i for i in range(1, 5)]},
                  pack={"runs_per_job": 4, "nodes": "any"})
    assert "nodes" not in spread["pack cpu-pack001 (4 runs)"]


def test_nodes_cpus_memory_and_gpus_per_node_are_each_checked():
    ddp = plan(strategies=["ddp"], distributed={"world_size": 4, "nodes": 2},
               resources={"cpus_per_task": 1, "mem_mb": 1000})
    assert check_fit(ddp, "multi", partitions()) == []  # 2 tasks of 1 CPU on each node
    assert "can ever give one job 0 such task(s)" in check_fit(ddp, "debug", partitions())[0]
    wide = plan(strategies=["ddp"], distributed={"world_size": 2, "nodes": 2},
                resources={"cpus_per_task": 4, "mem_mb": 1000})
    (error,) = check_fit(wide, "multi", partitions())
    assert "2 task(s) of 4 CPU(s), on 2 node(s)" in error and "fewer resources.cpus_per_task" in error
    big = plan(strategies=["cpu"], resources={"cpus_per_task": 1, "mem_mb": 30000})
    assert "30000 MB per node" in check_fit(big, "", partitions())[0]
    gpu = plan(strategies=["gpu"], resources={"cpus_per_task": 1, "mem_mb": 1000})
    assert check_fit(gpu, "multi", partitions()) == []
    assert "1 GPU(s) per node" in check_fit(gpu, "debug", partitions())[0]
    assert check_fit(gpu, "debug", None) == []  # no Slurm: nothing to say


def test_jobs_asking_more_than_one_mig_slice_are_refused_in_one_line():
    """Narval's slices (a100_3g.20gb): one per job. ddp over 2, a GPU pack of 4 and an
    MPS pack sharing 2 slices are refused; one slice per job (gpu, or packs on one slice
    through MPS) plans; a whole-GPU model is not a slice."""
    mig = {"cpus_per_task": 1, "mem_mb": 1000, "gpu_model": "a100_3g.20gb"}
    ddp = plan(strategies=["ddp"], distributed={"world_size": 2, "device": "cuda"}, resources=mig)
    (line,) = gpu_slice_errors(ddp)
    assert line.startswith("resources.gpu_model a100_3g.20gb is a MIG slice, and a job gets one "
                           "slice (a process sees one anyway), but run ddp asks 2: ")
    assert "pack.fuse or pack.per_gpu" in line
    sweep = {"lr": [0.01, 0.02, 0.03, 0.04]}
    packed = plan(strategies=["gpu"], resources=mig, sweep=sweep, pack={"runs_per_job": 4})
    assert "pack gpu-pack001 (4 runs) asks 4" in gpu_slice_errors(packed)[0]
    assert gpu_slice_errors(plan(strategies=["gpu"], resources=mig, sweep=sweep)) == []
    runs = build_runs(with_defaults({"strategies": ["gpu"], "resources": mig, "sweep": sweep,
                                     "pack": {"runs_per_job": 4, "per_gpu": 4}}))
    shared = job_shapes(runs, share_gpus(build_packs(runs, 4), runs, 4, 4))
    assert gpu_slice_errors(shared) == []  # 4 members on one slice under MPS
    two = build_runs(with_defaults({"strategies": ["gpu"], "resources": mig, "sweep": sweep,
                                    "pack": {"runs_per_job": 4, "per_gpu": 2}}))
    assert "asks 2" in gpu_slice_errors(job_shapes(two, share_gpus(build_packs(two, 4), two, 2, 4)))[0]
    whole = plan(strategies=["ddp"], distributed={"world_size": 2, "device": "cuda"},
                 resources={**mig, "gpu_model": "a100"})
    assert gpu_slice_errors(whole) == []


def test_more_cores_or_memory_per_gpu_than_a_nodes_share_is_a_warning():
    """multi's GPU nodes: 2 CPUs and 22,900 MB for 2 GPUs, a share of 1 core, 11,450 MB."""
    fair = plan(strategies=["ddp"], distributed={"world_size": 2, "device": "cuda"},
                resources={"cpus_per_task": 1, "mem_mb": 1000})
    multi = candidates(partitions(), "multi", True)[0]
    assert gpu_share_warnings(fair, multi) == []
    greedy = plan(strategies=["gpu"], resources={"cpus_per_task": 2, "mem_mb": 16000})
    (line,) = gpu_share_warnings(greedy, multi)
    assert line.startswith("run gpu asks 2 cores and 16,000 MB per GPU, more than a GPU's share "
                           "of a node in partition multi (1 cores, 11,450 MB)")
    debug = candidates(partitions(), "debug", True)[0]
    assert gpu_share_warnings(greedy, debug) == []  # no GPU nodes there
    assert gpu_share_warnings(greedy, []) == []  # no Slurm


SQUEUE = """\
48|PENDING|DependencyNeverSatisfied|(null)|debug||2026-12-06T17:40:09
22|PENDING|PartitionConfig|rule_train_cpu_wildcards_cpu-pack001_1|debug||2026-12-06T17:40:09
45|PENDING|Resources|rule_train_cpu_wildcards_cpu-pack002_1|multi||2026-12-06T17:40:10
46|PENDING|PartitionConfig|rule_train_cpu_wildcards_cpu-pack001_1|debug||2026-12-06T17:40:10
47|RUNNING|None|rule_train_cpu_wildcards_cpu-pack003_1|debug||2026-12-06T17:40:10
"""
OWNED = {"48", "22", "45", "47"}  # 46: not submitted by this controller (another workflow's)


def test_stuck_jobs_of_this_workflow_are_named_once():
    assert [j["job"] for j in stuck_jobs(SQUEUE, OWNED)] == ["48", "22"]
    said = []
    watch = PendingWatch(OWNED, said.append, query=lambda: SQUEUE)
    assert len(watch.poll()) == 2 and watch.poll() == []
    assert PendingWatch(set(), said.append, query=lambda: pytest.fail("asked")).poll() == []
    assert said[1] == ("Slurm job 22 (train_cpu_wildcards_cpu-pack001_1) is pending for "
                       "PartitionConfig in partition debug: it asks more than the partition's "
                       "nodes can ever give; it will not start by itself: scancel 22, then "
                       "change the request or the partition (snakemake -n checks the plan "
                       "against the partition)")


def test_a_whole_node_partition_says_what_a_small_job_costs_and_the_pack_that_fills_it():
    """Trillium's CPU partition gives whole nodes (OverSubscribe=EXCLUSIVE): a 2-core run
    holds a node, billed whole. Here the node of debug is made a 16-core whole-node one."""
    parts = partitions()
    parts["debug"]["whole_node"] = True
    parts["debug"]["nodes"][0]["cpus"] = 16
    sweep = {"lr": [0.01 * i for i in range(1, 9)]}
    alone = plan(strategies=["cpu"], resources={"cpus_per_task": 2, "mem_mb": 1000}, sweep=sweep)
    assert whole_node_notes(alone, "", parts) == [
        "run cpu_lr0p01 (and 7 more alike): the default partition debug (debug) gives whole "
        "nodes (OverSubscribe=EXCLUSIVE), so one job of 2 CPU(s) holds a 16-CPU node and is "
        "billed for all of it (12% used): pack.runs_per_job: 8 with pack.nodes: 1 and "
        "pack.whole_node: true fills the node"]
    half = plan(strategies=["cpu"], resources={"cpus_per_task": 2, "mem_mb": 1000}, sweep=sweep,
                pack={"runs_per_job": 2})
    (line,) = whole_node_notes(half, "", parts)  # packs of 2: 4 of 16 CPUs
    assert line.startswith("pack cpu-pack001 (2 runs) (and 3 more alike): ") and \
        "one job of 4 CPU(s)" in line and "pack.runs_per_job: 8 " in line
    full = plan(strategies=["cpu"], resources={"cpus_per_task": 2, "mem_mb": 1000}, sweep=sweep,
                pack={"runs_per_job": 8, "whole_node": True})
    assert whole_node_notes(full, "", parts) == []  # the node is filled
    parts["debug"]["whole_node"] = False
    assert whole_node_notes(alone, "", parts) == []  # by-core: a job pays for its cores
