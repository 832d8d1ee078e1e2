"""Each job's Slurm account, settled at `snakemake -n` from one sacctmgr answer (recorded
from the test cluster, tests/slurm/cluster.sh: root, def-cifar_cpu, def-cifar_gpu): exact,
mapped per CPU/GPU job where the site lists <account>_cpu/_gpu, refused naming the user's
accounts otherwise; in the plan, every job's slurm_account resource is the mapped one."""

import pytest

from cifarflow.controller.accounts import choices, job_accounts
from cifarflow.controller.plan import PlanError
from test_workflow_plan import LIMITS, ROOM, bin_dir, make_plan  # noqa: F401

SACCTMGR = "root\ndef-cifar_cpu\ndef-cifar_gpu\nroot\n"  # sacctmgr -n -P ... format=Account
MINE = tuple(dict.fromkeys(SACCTMGR.split()))  # slurm.user_accounts


def test_an_account_the_user_has_is_used_as_it_is():
    assert job_accounts("root", MINE, {False, True})[0] == {False: "root", True: "root"}
    assert job_accounts("def-cifar_gpu", MINE, {True})[0] == {True: "def-cifar_gpu"}


def test_a_rac_style_account_maps_to_its_cpu_and_gpu_accounts():
    mapped, line = job_accounts("def-cifar", MINE, {False, True})
    assert mapped == {False: "def-cifar_cpu", True: "def-cifar_gpu"}
    assert line == ("slurm account: CPU jobs on def-cifar_cpu, GPU jobs on def-cifar_gpu "
                    "(slurm.account def-cifar; the site lists root, def-cifar_cpu, def-cifar_gpu)")
    with pytest.raises(ValueError, match=r"\(no def-x_gpu\)"):
        job_accounts("def-x", ("def-x_cpu",), {False, True})


def test_an_unknown_account_is_refused_naming_the_users_accounts():
    with pytest.raises(ValueError) as refused:
        job_accounts("def-nobody", MINE, {False})
    assert str(refused.value) == (
        "slurm.account def-nobody is not one of your Slurm accounts (sacctmgr: root, "
        "def-cifar_cpu, def-cifar_gpu): sbatch would refuse every job; set slurm.account in "
        "config/config.yaml (or $SLURM_ACCOUNT) to one of root, def-cifar (def-cifar_cpu, "
        "def-cifar_gpu)")


def test_no_account_is_the_only_one_or_refused_among_several():
    assert job_accounts("", ("def-a_cpu", "def-a_gpu"), {True})[0] == {True: "def-a_gpu"}
    assert job_accounts("", ("def-a",), {False})[0] == {False: "def-a"}
    with pytest.raises(ValueError, match=r"slurm.account is not set and you have several .*"
                                         r"to one of root, def-cifar \(def-cifar_cpu"):
        job_accounts("", MINE, {False})
    with pytest.raises(ValueError, match="sacctmgr lists no Slurm account of yours"):
        job_accounts("def-cifar", (), {False})
    assert choices(["def-a"]) == "def-a"


def checked(plan, accounts=MINE):
    plan.checks.against_cluster(lambda results: ROOM, limits_of=lambda: LIMITS,
                               partitions_of=lambda: None, accounts_of=lambda user: accounts)
    return plan


def test_every_job_of_the_plan_gets_its_mapped_account(tmp_path, bin_dir):  # noqa: F811
    env = {"SLURM_ACCOUNT": "def-cifar"}
    plan = checked(make_plan(tmp_path, bin_dir, environ=env, strategies=["cpu", "gpu"],
                             sweep={"lr": [0.1, 0.2]}, pack={"runs_per_job": 2}))
    assert plan.pack_rules.resources("cpu")["slurm_account"] == "def-cifar_cpu"
    assert plan.pack_rules.resources("gpu")["slurm_account"] == "def-cifar_gpu"
    assert plan.placement.for_job(bool(plan.software.env_gpu))["slurm_account"] == "def-cifar_gpu"  # record job
    runs = checked(make_plan(tmp_path, bin_dir, environ=env, strategies=["cpu", "gpu"]))
    assert runs.run_rules.resources("cpu")["slurm_account"] == "def-cifar_cpu"
    assert runs.run_rules.resources("gpu")["slurm_account"] == "def-cifar_gpu"
    cpu_only = checked(make_plan(tmp_path, bin_dir, environ=env))
    assert cpu_only.placement.for_job(bool(cpu_only.software.env_gpu))["slurm_account"] == "def-cifar_cpu"
    assert "CPU jobs on def-cifar_cpu" in cpu_only.log.infos[-1]


def test_an_unknown_account_stops_a_slurm_plan_and_warns_otherwise(tmp_path, bin_dir):  # noqa: F811
    env = {"SLURM_ACCOUNT": "def-nobody"}
    with pytest.raises(PlanError, match="slurm.account def-nobody is not one of your"):
        checked(make_plan(tmp_path, bin_dir, jobs_at_once=4, environ=env))
    local = checked(make_plan(tmp_path, bin_dir, environ=env))
    assert "slurm.account def-nobody is not one of your" in local.log.warnings[0]
    assert local.run_rules.resources("cpu")["slurm_account"] == "def-nobody"  # left as given
    quiet = checked(make_plan(tmp_path, bin_dir, environ=env), accounts=None)
    assert quiet.log.infos[-1].startswith("slurm account: sacctmgr does not answer here")
