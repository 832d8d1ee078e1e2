"""The first-day refusals of an Alliance-shaped site, at `snakemake -n` through
profiles/slurm as a user types it, on the test cluster (tests/slurm/cluster.sh): no default
partition (jobs routed by time limit and GPUs: cpubase_bycore_b1 3 h, cpubase_bycore_b3
24 h, gpubase_bygpu_b1/b3), hidden urgent and multi, typed GPUs (n1 a100 and
a100_3g.20gb, n2 h100), the user in def-cifar_cpu / def-cifar_gpu / root, a 1 GiB /project.
Dry runs, and one real submission routed by the site."""

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, snakemake

pytestmark = pytest.mark.slurm

CONFIG = ROOT / "config" / "config.yaml"


def dry_run(tmp_path, extra: str, account: str = "def-cifar"):
    over = tmp_path / "over.yaml"
    over.write_text(extra)
    out = snakemake(tmp_path, "-n", "--profile", ROOT / "profiles/slurm", check=False,
                    configfile=[CONFIG, over], env={"SLURM_ACCOUNT": account})
    return out.returncode, out.stdout + out.stderr


def test_a_24_hour_segment_is_routed_and_the_account_mapped_per_job(tmp_path):
    rc, text = dry_run(tmp_path, "resources: {runtime: 1440}\n")
    assert rc == 0, text[-3000:]
    assert "CPU jobs to one of cpubase_bycore_b1 MaxTime 180 min, cpubase_bycore_b3 MaxTime " \
           "1440 min" in text
    assert "slurm_account=def-cifar_cpu" in text and "slurm_account=def-cifar," not in text
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    rc, text = dry_run(gpu, "strategies: [cpu, gpu]\nresources: {gpu_model: h100}\n")
    assert rc == 0, text[-3000:]
    assert "CPU jobs on def-cifar_cpu, GPU jobs on def-cifar_gpu" in text
    assert "slurm_account=def-cifar_gpu" in text and "slurm_account=def-cifar_cpu" in text


def test_a_30_hour_segment_is_refused_naming_the_routed_limits(tmp_path):
    rc, text = dry_run(tmp_path, "resources: {runtime: 1800}\n")
    assert rc != 0
    assert ("resources.runtime 1800 min of run cpu is above every partition this CPU job can "
            "be routed to: cpubase_bycore_b1 MaxTime 180 min, cpubase_bycore_b3 MaxTime 1440 "
            "min: set resources.runtime to at most 1440") in text
    assert "slurm.partition" not in text.split("resources.runtime 1800 min")[1].splitlines()[0]


def test_an_unknown_account_is_refused_naming_the_users_accounts(tmp_path):
    rc, text = dry_run(tmp_path, "{}\n", account="def-nobody")
    assert rc != 0
    assert ("slurm.account def-nobody is not one of your Slurm accounts (sacctmgr: ") in text
    assert "def-cifar (def-cifar_cpu, def-cifar_gpu)" in text


def test_a_gpu_type_no_node_has_is_refused_naming_the_types(tmp_path):
    rc, text = dry_run(tmp_path, "strategies: [gpu]\nresources: {gpu_model: v100}\n")
    assert rc != 0
    assert ("resources.gpu_model v100 is on no node of every partition a GPU job can be routed "
            "to") in text
    assert "set resources.gpu_model to one of a100, a100_3g.20gb, h100" in text


@pytest.fixture
def on_project(tmp_path):
    where = Path("/project") / f"cifarflow-{tmp_path.name}"
    yield where
    shutil.rmtree(where, ignore_errors=True)


def test_a_1000_run_resnet18_sweep_is_refused_on_the_1_gib_project(tmp_path, on_project):
    lrs = ", ".join(f"{0.0001 * i:.4f}" for i in range(1, 1001))
    rc, text = dry_run(tmp_path, f"results: {on_project}\ntrain: {{model: resnet18}}\n"
                                 f"sweep: {{lr: [{lrs}]}}\npack: {{runs_per_job: 10}}\n")
    assert rc != 0
    assert "storage: the plan needs ~" in text and "more than /project" in text
    assert "results: on a larger filesystem (/scratch" in text


def test_a_24_hour_segment_really_runs_where_the_site_routes_it(tmp_path):
    """Submitted for real, as a user types it (SLURM_ACCOUNT=def-cifar, no partition): the
    site's submit plugin routes the 24 h job to cpubase_bycore_b3 and accounting records it
    on def-cifar_cpu; the run trains to its end."""
    from alliance import CPU_ACCOUNT
    from conftest import summary_rows
    from test_slurm import profile_args

    over = tmp_path / "over.yaml"
    over.write_text("resources: {runtime: 1440, cpus_per_task: 1, mem_mb: 1500}\n"
                    "segments: {count: 1}\n")
    local = ROOT / "tests" / "configs" / "local" / "config.yaml"
    snakemake(tmp_path, *profile_args(tmp_path), configfile=[local, over],
              env={"SLURM_ACCOUNT": "def-cifar"})
    row = summary_rows(tmp_path)["cpu"]
    assert row["status"] == "ok"
    (job,) = row["slurm_job_ids"].split()
    accounted = subprocess.run(["sacct", "-X", "-P", "-n", "-j", job, "-o",
                                "Partition,Account,Timelimit,State"], capture_output=True,
                               text=True, check=True).stdout.strip()
    assert accounted == f"cpubase_bycore_b3|{CPU_ACCOUNT}|1-00:00:00|COMPLETED"
