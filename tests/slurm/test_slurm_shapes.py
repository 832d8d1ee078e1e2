"""Sites of other shapes, made from the test cluster for one test and restored after it
(these tests change the whole cluster: the Slurm tests run one at a time), each tried as a
user types it through profiles/slurm (issue 53's guesses, issue 54's shapes):

- every node has a GPU (the CPU partitions on the GPU nodes): CPU jobs are accepted at -n
  and run there (they were refused: "every partition a CPU job can be routed to is none");
- a default partition beside the site's routing: a job naming none is routed by the site
  (the plugin passed -p <default> to every job, bypassing the routing), and
  `slurm.partition: default` is Alliance's "route it";
- a long partition open to another account only: not a place for the user's 20,000-minute
  runtime (it passed -n);
- a QOS the user is not in, with MaxSubmitJobsPerUser 2: not the user's limit (an 8-run
  sweep with --jobs 6 was refused);
- CPU partitions that give whole nodes (OverSubscribe=EXCLUSIVE, Trillium's): the plan says
  what a small job costs there and the pack that fills a node."""

import subprocess

import pytest

from conftest import ROOT, snakemake, summary_rows
from test_slurm import profile_args

pytestmark = pytest.mark.slurm
LOCAL = ROOT / "tests" / "configs" / "local" / "config.yaml"
ONE_CORE = "resources: {cpus_per_task: 1, mem_mb: 1500, runtime: 10}\nsegments: {count: 1}\n"


def scontrol(*args):
    subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True)


def partition_field(name: str, key: str) -> str:
    out = subprocess.run(["scontrol", "-o", "show", "partition", name], capture_output=True,
                         text=True, check=True).stdout
    return next(f.split("=", 1)[1] for f in out.split() if f.startswith(f"{key}="))


@pytest.fixture
def changed_partitions():
    """Change partitions for one test (scontrol update ... key=value); each restored after."""
    saved = []

    def change(name, **values):
        saved.append((name, {k: partition_field(name, k) for k in values}))
        scontrol("update", f"PartitionName={name}", *(f"{k}={v}" for k, v in values.items()))

    yield change
    for name, values in reversed(saved):
        scontrol("update", f"PartitionName={name}", *(f"{k}={v}" for k, v in values.items()))


def dry_run(workdir, extra: str, *args):
    over = workdir / "over.yaml"
    over.write_text(extra)
    out = snakemake(workdir, "-n", "--profile", ROOT / "profiles/slurm", *args, check=False,
                    configfile=[LOCAL, over], env={"SLURM_ACCOUNT": "def-cifar"})
    return out.returncode, out.stdout + out.stderr


def run_for_real(workdir, extra: str = "") -> dict:
    """A one-segment cpu run through profiles/slurm as a user types it; where it ran."""
    over = workdir / "over.yaml"
    over.write_text(ONE_CORE + extra)
    snakemake(workdir, *profile_args(workdir), configfile=[LOCAL, over],
              env={"SLURM_ACCOUNT": "def-cifar"})
    row = summary_rows(workdir)["cpu"]
    assert row["status"] == "ok", row
    (job,) = row["slurm_job_ids"].split()
    partition, nodes = subprocess.run(
        ["sacct", "-X", "-P", "-n", "-j", job, "-o", "Partition,NodeList"], capture_output=True,
        text=True, check=True).stdout.strip().split("|")
    return {"partition": partition, "nodes": nodes}


def test_a_site_where_every_node_has_a_gpu_runs_cpu_jobs(tmp_path, changed_partitions):
    changed_partitions("cpubase_bycore_b1", Nodes="n[1-2]")
    changed_partitions("cpubase_bycore_b3", Nodes="n[1-2]")
    rc, text = dry_run(tmp_path, ONE_CORE)
    assert rc == 0 and "has no partition to run in" not in text, text[-3000:]
    assert "run cpu -> partition cpubase_bycore_b1 (nodes n" in text
    ran = run_for_real(tmp_path)
    assert ran["partition"] == "cpubase_bycore_b1" and ran["nodes"] in ("n1", "n2"), ran


def test_beside_a_default_partition_the_site_still_routes_each_job(tmp_path, changed_partitions):
    changed_partitions("cpubase_bycore_b3", Default="YES")
    # 10 min: the site routes it to its 3 h partition (the plugin sent -p cpubase_bycore_b3)
    assert run_for_real(tmp_path)["partition"] == "cpubase_bycore_b1"
    rc, text = dry_run(tmp_path, ONE_CORE)
    assert rc == 0 and "run cpu -> partition cpubase_bycore_b1" in text, text[-3000:]
    named = tmp_path / "named"
    named.mkdir()
    rc, text = dry_run(named, ONE_CORE + "slurm: {partition: default}\n")
    assert rc == 0 and "not a partition of this cluster" not in text, text[-3000:]
    assert "run cpu -> partition cpubase_bycore_b1" in text


@pytest.fixture
def long_partition_of_another_account():
    scontrol("create", "PartitionName=long_other", "Nodes=vm", "MaxTime=30-00:00:00",
             "AllowAccounts=def-other_cpu", "State=UP")
    yield "long_other"
    scontrol("delete", "PartitionName=long_other")


def test_a_partition_of_another_account_is_no_place_for_your_jobs(
        tmp_path, long_partition_of_another_account):
    rc, text = dry_run(tmp_path, "resources: {cpus_per_task: 1, runtime: 20000}\n")
    assert rc != 0, text[-3000:]
    assert "run cpu: Slurm refuses it: No partition takes a cpu job of 20000 minutes" in text
    assert "cpubase_bycore_b3 MaxTime 1440 min: set resources.runtime to at most 1440" in text
    # named: the plan's reading says the partition is closed to def-cifar_cpu; Slurm takes
    # the job (these tests run as root, whom AllowAccounts does not bind): Slurm wins, and
    # the line says the two disagreed
    named = tmp_path / "named"
    named.mkdir()
    rc, text = dry_run(named, "resources: {cpus_per_task: 1, runtime: 20000}\n"
                              "slurm: {partition: long_other}\n")
    assert rc == 0, text[-3000:]
    assert ("the plan's reading of the partitions refused run cpu (partition long_other does "
            "not take jobs of account def-cifar_cpu") in text
    assert "Slurm accepts it in partition long_other: going by Slurm" in text


@pytest.fixture
def qos_of_others():
    subprocess.run(["sacctmgr", "-i", "add", "qos", "tight", "MaxSubmitJobsPerUser=2"],
                   check=True, capture_output=True)
    yield "tight"
    subprocess.run(["sacctmgr", "-i", "delete", "qos", "tight"], check=True,
                   capture_output=True)


def test_a_qos_you_are_not_in_is_not_your_limit(tmp_path, qos_of_others):
    sweep = "sweep: {lr: [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08]}\n"
    rc, text = dry_run(tmp_path, ONE_CORE + sweep, "--jobs", "6")
    assert rc == 0, text[-3000:]
    assert "MaxSubmitJobs 100" in text and "MaxSubmitJobs 2" not in text


def test_every_node_declares_its_shape_whatever_the_host():
    """cluster.sh writes each node's CPUs, memory and GPUs (config_overrides), so a 2-, 16- or
    64-core host shows the same cluster: the one every test here is written for."""
    out = subprocess.run(["scontrol", "-o", "show", "node"], capture_output=True, text=True,
                         check=True).stdout
    nodes = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        nodes[fields["NodeName"]] = (fields["CPUTot"], fields["RealMemory"], fields["Gres"])
    assert len(nodes) == 3 and {cpus for cpus, _, _ in nodes.values()} == {"2"}, nodes
    assert {mem for _, mem, _ in nodes.values()} == {"16000"}, nodes
    assert sorted(gres for _, _, gres in nodes.values()) == [
        "(null)", "gpu:a100:2,gpu:a100_3g.20gb:1", "gpu:h100:2"], nodes


def test_a_whole_node_partition_says_what_a_small_job_costs(tmp_path, changed_partitions):
    """Trillium's CPU partition gives whole nodes (OverSubscribe=EXCLUSIVE; issue 59): the
    plan says that a 1-core run holds a whole node and is billed for it, and the pack that
    fills the node (the nodes here declare 2 CPUs)."""
    changed_partitions("cpubase_bycore_b1", OverSubscribe="EXCLUSIVE")
    changed_partitions("cpubase_bycore_b3", OverSubscribe="EXCLUSIVE")
    rc, text = dry_run(tmp_path, ONE_CORE)
    assert rc == 0, text[-3000:]
    assert ("run cpu: every partition a CPU job can be routed to (cpubase_bycore_b1, "
            "cpubase_bycore_b3) gives whole nodes (OverSubscribe=EXCLUSIVE), so one job of 1 "
            "CPU(s) holds a 2-CPU node and is billed for all of it (50% used): "
            "pack.runs_per_job: 2 with pack.nodes: 1 and pack.whole_node: true fills the "
            "node") in text, text[-3000:]
