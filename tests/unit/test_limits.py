"""The plan against the cluster's limits: what `snakemake -n` says and refuses. The counts
(limits.py), and where each job may run (routing.py) on an Alliance-shaped site: recorded
`scontrol -a -o show partition/node` of the test cluster (tests/slurm/cluster.sh): no
default partition, jobs routed by time limit and GPUs, two hidden partitions, typed GPUs."""

import pytest

from cifarflow.config import with_defaults
from cifarflow.controller.limits import check_plan
from cifarflow.controller.pack_plan import plan_packs
from cifarflow.controller.packs import job_shapes
from cifarflow.controller.partitions import gpu_types, read_partitions
from cifarflow.slurm import minutes as slurm_minutes
from cifarflow.controller.plan import build_runs
from cifarflow.controller.routing import check_fit, describe_placement
from cifarflow.slurm import fields

PARTITIONS = """\
PartitionName=cpubase_bycore_b1 AllowGroups=ALL AllowAccounts=ALL Default=NO Hidden=NO MaxNodes=UNLIMITED MaxTime=03:00:00 Nodes=vm State=UP MaxCPUsPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
PartitionName=cpubase_bycore_b3 AllowGroups=ALL AllowAccounts=ALL Default=NO Hidden=NO MaxNodes=UNLIMITED MaxTime=1-00:00:00 Nodes=vm,n[1-2] State=UP MaxCPUsPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
PartitionName=gpubase_bygpu_b1 AllowGroups=ALL AllowAccounts=ALL Default=NO Hidden=NO MaxNodes=UNLIMITED MaxTime=03:00:00 Nodes=n[1-2] State=UP MaxCPUsPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
PartitionName=gpubase_bygpu_b3 AllowGroups=ALL AllowAccounts=ALL Default=NO Hidden=NO MaxNodes=UNLIMITED MaxTime=1-00:00:00 Nodes=n[1-2] State=UP MaxCPUsPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
PartitionName=urgent AllowGroups=ALL AllowAccounts=ALL Default=NO Hidden=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=vm State=UP MaxCPUsPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
PartitionName=multi AllowGroups=ALL AllowAccounts=ALL Default=NO Hidden=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=n[1-2] State=UP MaxCPUsPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
"""
NODES = """\
NodeName=vm Arch=x86_64 CoresPerSocket=2 CPUAlloc=0 CPUEfctv=2 CPUTot=2 Gres=(null) RealMemory=22900 State=IDLE Partitions=cpubase_bycore_b1,cpubase_bycore_b3,urgent
NodeName=n1 Arch=x86_64 CoresPerSocket=2 CPUAlloc=0 CPUEfctv=2 CPUTot=2 Gres=gpu:a100:2(S:0),gpu:a100_3g.20gb:1(S:0) RealMemory=22900 State=IDLE Partitions=cpubase_bycore_b3,gpubase_bygpu_b1,gpubase_bygpu_b3,multi
NodeName=n2 Arch=x86_64 CoresPerSocket=2 CPUAlloc=0 CPUEfctv=2 CPUTot=2 Gres=gpu:h100:2 RealMemory=22900 State=IDLE Partitions=cpubase_bycore_b3,gpubase_bygpu_b1,gpubase_bygpu_b3,multi
"""


def site(kind):
    return [fields(line) for line in (PARTITIONS if kind == "partition" else NODES).splitlines()]


def shapes(**config):
    config = with_defaults(config)
    runs = build_runs(config)
    return job_shapes(runs, plan_packs(runs, config["pack"]))


@pytest.mark.parametrize("text, minutes", [
    ("UNLIMITED", None), ("INFINITE", None), ("30", 30), ("5:00", 5), ("2:00:00", 120),
    ("1-00:00:00", 1440), ("3-12", 3 * 1440 + 720), ("0:30:30", 30.5)])
def test_slurm_time_format(text, minutes):
    assert slurm_minutes(text) == minutes


def test_typed_gres_is_counted_per_type():
    assert gpu_types("gpu:a100:2(S:0-1),gpu:a100_3g.20gb:1") == {"a100": 2, "a100_3g.20gb": 1}
    assert gpu_types("gpu:2") == {"": 2} and gpu_types("(null)") == {}
    n1 = read_partitions(site)["gpubase_bygpu_b1"]["nodes"][0]
    assert (n1["gpus"], n1["gpu_types"]) == (3, {"a100": 2, "a100_3g.20gb": 1})


def cpu(runtime, **over):
    return shapes(strategies=["cpu"], resources={"cpus_per_task": 1, "mem_mb": 1000,
                                                 "runtime": runtime}, **over)


def test_without_a_partition_a_24_hour_segment_is_routed_to_the_24_hour_partition():
    assert check_fit(cpu(1440), "", read_partitions(site)) == []
    assert check_fit(cpu(60), "", read_partitions(site)) == []


def test_without_a_partition_a_30_hour_segment_is_refused_naming_the_routed_limits():
    (error,) = check_fit(cpu(1800), "", read_partitions(site))
    assert error == (
        "resources.runtime 1800 min of run cpu is above every partition this CPU job can be "
        "routed to: cpubase_bycore_b1 MaxTime 180 min, cpubase_bycore_b3 MaxTime 1440 min: set "
        "resources.runtime to at most 1440 (segments.count splits a run into more segments)")
    assert "slurm.partition" not in error  # hidden multi/urgent (unlimited) are not routed to


def test_a_named_partition_is_checked_alone_and_an_unknown_one_is_refused():
    (error,) = check_fit(cpu(240), "cpubase_bycore_b1", read_partitions(site))
    assert "above partition cpubase_bycore_b1's MaxTime of 180 min" in error
    assert error.endswith("or unset slurm.partition so the site routes it")
    assert check_fit(cpu(1800), "multi", read_partitions(site)) == []  # named: hidden is fine
    (unknown,) = check_fit(cpu(60), "cpubase", read_partitions(site))
    assert unknown.startswith("slurm.partition cpubase is not a partition of this cluster "
                              "(cpubase_bycore_b1, cpubase_bycore_b3, gpubase_bygpu_b1, ")


def test_without_a_partition_node_fit_is_still_checked_over_the_routed_partitions():
    sweep = {"lr": [0.01 * i for i in range(1, 9)]}
    (error,) = check_fit(cpu(60, sweep=sweep, pack={"runs_per_job": 8}), "",
                         read_partitions(site))
    assert error.startswith(  # a CPU pack on one node (pack.nodes: 1)
        "pack cpu-pack001 (8 runs) asks 8 task(s) of 1 CPU(s), on 1 node(s), 1000 MB per CPU, "
        "and every partition a CPU job can be routed to can ever give one job at most: "
        "cpubase_bycore_b1 2 (1 node(s): vm 2 CPUs 22900 MB); cpubase_bycore_b3 2 (3 node(s): ")
    assert error.endswith("set pack.runs_per_job: 2") and "slurm.partition" not in error
    six = {"lr": [0.01 * i for i in range(1, 7)]}
    (spread,) = check_fit(cpu(60, sweep=six, pack={"runs_per_job": 6}), "",
                          read_partitions(site))  # 6 fit on b3's 3 nodes, if spread
    assert spread.endswith("set pack.runs_per_job: 2, or pack.nodes: any (Slurm spreads the "
                           "members over nodes)")
    assert check_fit(cpu(60, sweep=six, pack={"runs_per_job": 6, "nodes": "any"}), "",
                     read_partitions(site)) == []


def gpu(model, **over):
    return shapes(strategies=["gpu"], resources={"cpus_per_task": 1, "mem_mb": 1000,
                                                 "gpu_model": model}, **over)


def test_a_gpu_model_no_node_has_is_refused_naming_the_types():
    (error,) = check_fit(gpu("v100"), "", read_partitions(site))
    assert error == (
        "resources.gpu_model v100 is on no node of every partition a GPU job can be routed to "
        "(cpubase_bycore_b1, cpubase_bycore_b3, gpubase_bygpu_b1, gpubase_bygpu_b3), whose GPU "
        "types are a100, a100_3g.20gb, h100: sbatch would refuse every GPU job; set "
        "resources.gpu_model to one of a100, a100_3g.20gb, h100, or any for any type")
    for model in ("h100", "a100", "a100_3g.20gb", ""):
        assert check_fit(gpu(model), "", read_partitions(site)) == []


def test_gpus_are_counted_per_type():
    ddp = {"world_size": 3, "device": "cuda"}  # 3 GPUs on one node: n1 has 3 of two types
    assert check_fit(shapes(strategies=["ddp"], distributed=ddp,
                            resources={"cpus_per_task": 1, "mem_mb": 1000}), "",
                     read_partitions(site)) != []  # 3 tasks of 1 CPU: n1 has 2 CPUs
    pair = {"world_size": 2, "device": "cuda"}
    assert check_fit(shapes(strategies=["ddp"], distributed=pair, resources={
        "cpus_per_task": 1, "mem_mb": 1000, "gpu_model": "h100"}), "", read_partitions(site)) == []
    (error,) = check_fit(shapes(strategies=["ddp"], distributed=pair, resources={
        "cpus_per_task": 1, "mem_mb": 1000, "gpu_model": "a100_3g.20gb"}), "",
        read_partitions(site))
    assert "2 GPU(s) per node" in error  # one slice on n1 only


def test_the_placement_line_names_the_routed_partitions():
    line = describe_placement(read_partitions(site), "")
    assert line == ("partitions: routed by the site (no slurm.partition, no default partition): "
                    "CPU jobs to one of cpubase_bycore_b1 MaxTime 180 min, cpubase_bycore_b3 "
                    "MaxTime 1440 min; GPU jobs to one of cpubase_bycore_b3 MaxTime 1440 min, "
                    "gpubase_bygpu_b1 MaxTime 180 min, gpubase_bygpu_b3 MaxTime 1440 min")


LIMITS = {"max_job_count": "10000", "max_array_size": "1001", "accounting": True,
          "max_submit": 100}


def test_a_round_above_the_submit_limit_suggests_a_pack_size():
    lines, errors = check_plan(1000, 1000, 10, 10000, LIMITS, 20)
    assert errors == []
    assert lines[0] == ("plan: 1000 segment job(s) per round, 10 round(s), 10000 segment "
                        "job(s) in all, at most 20 queued at once (--jobs)")
    assert "pack.runs_per_job: 10 would submit a round at once" in lines[1]
    assert "MaxSubmitJobs 100" in lines[-1]


def test_jobs_above_the_submit_limit_are_refused():
    _, errors = check_plan(8, 8, 2, 16, LIMITS, 200)
    assert errors == ["--jobs 200 is above your MaxSubmitJobs of 100: sbatch would be refused; "
                      "run with --jobs 100 (profiles/slurm: jobs)"]


def test_without_slurm_one_line_says_so():
    lines, errors = check_plan(4, 4, 2, 8, None, None)
    assert errors == [] and lines[-1].startswith("cluster limits: no answer from Slurm here")


def test_scontrol_records_are_read_as_key_value_pairs():
    record = fields("PartitionName=short AllowGroups=ALL Default=NO MaxTime=00:05:00 "
                    "MaxNodes=UNLIMITED")
    assert record["PartitionName"] == "short" and slurm_minutes(record["MaxTime"]) == 5
