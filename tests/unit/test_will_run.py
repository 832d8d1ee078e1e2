"""Ask Slurm instead of guessing it: each distinct job of the plan is asked with sbatch
--test-only and the options the Slurm plugin's own code writes for it; Slurm's refusal (in
its words, real sbatch answers of the test cluster) is the plan's, a job Slurm takes but
places where it can never start is refused naming the partition, a disagreement with the
plan's reading of the partitions says so, and a sweep of alike jobs asks once. The
partition guesses: a site where every node has a GPU, partitions closed to the account,
`partition: default`, a QOS the user is not in."""

import pytest

from cifarflow import slurm
from cifarflow.controller.routing import candidates, check_fit, job_error
from cifarflow.controller.will_run import ask_slurm, first_try, read_answer, submit_flags

PLACED = ("sbatch: Job 62 to start at 2026-12-07T13:14:36 using 1 processors on nodes vm in "
          "partition cpubase_bycore_b1\n")
ROUTE_REFUSED = ("sbatch: error: No partition takes a cpu job of 2000 minutes: the longest "
                 "takes 1440 minutes\nallocation failure: Unspecified error\n")
NO_CONFIG = "allocation failure: Requested node configuration is not available\n"
BAD_ACCOUNT = "allocation failure: Invalid account or account/partition combination specified\n"


def reply(stderr, ok=False):
    return slurm.Reply(("sbatch",), "ok" if ok else "failed", stderr=stderr)


def test_sbatch_test_only_answers_are_read():
    assert read_answer(reply(PLACED, ok=True)).partition == "cpubase_bycore_b1"
    assert read_answer(reply(PLACED, ok=True)).nodes == "vm"
    assert read_answer(reply(ROUTE_REFUSED)).reason == \
        "No partition takes a cpu job of 2000 minutes: the longest takes 1440 minutes"
    assert read_answer(reply(NO_CONFIG)).reason == "Requested node configuration is not available"
    assert read_answer(reply(BAD_ACCOUNT)).reason == \
        "Invalid account or account/partition combination specified"
    missing = read_answer(slurm.Reply(("sbatch",), "missing", detail="sbatch: not found"))
    assert not missing.asked


def test_the_options_are_the_slurm_plugins_own():
    cpu = {"slurm_account": "def-x_cpu", "runtime": 60, "mem_mb": 2000, "cpus_per_task": 2}
    assert submit_flags(cpu, 2) == ["--export=ALL", "-A", "def-x_cpu", "-t", "60", "--mem",
                                    "2000", "--ntasks=1", "--cpus-per-task=2"]
    ddp = {"slurm_account": "def-x_cpu", "runtime": 60, "mem_mb": 1000, "cpus_per_task": 1,
           "nodes": 2, "tasks_per_node": 2, "mpi": "srun", "slurm_partition": "p1"}
    assert submit_flags(ddp, 1) == ["--export=ALL", "-A", "def-x_cpu", "-p", "p1", "-t", "60",
                                    "--mem", "1000", "--nodes=2", "--ntasks-per-node=2",
                                    "--cpus-per-task=1"]
    gpu = {"slurm_account": "def-x_gpu", "runtime": 30, "mem_mb_per_cpu": 500, "tasks": 2,
           "cpus_per_task": 1, "gres": "gpu:h100:1"}
    assert submit_flags(gpu, 1) == ["--export=ALL", "-A", "def-x_gpu", "-t", "30",
                                    "--mem-per-cpu", "500", "--ntasks-per-gpu=2",
                                    "--cpus-per-task=1", "--gres=gpu:h100:1"]


def test_a_rules_functions_are_called_as_for_the_first_try():
    assert first_try(7, {"run": "a"}) == 7
    assert first_try(lambda wildcards, attempt: (wildcards.run, attempt), {"run": "a"}) == ("a", 1)
    assert first_try(lambda wildcards, input, attempt: input.previous, {"run": "a"}) == []


SITE = {  # an Alliance-shaped site, as partitions.partition_capacity reads it
    "cpubase_bycore_b1": {"name": "cpubase_bycore_b1", "max_time_min": 180, "up": True,
                          "hidden": False, "default": False, "max_nodes": None,
                          "max_cpus_per_node": None, "max_mem_per_node": None,
                          "nodes": [{"name": "vm", "cpus": 2, "mem_mb": 20000, "gpus": 0,
                                     "gpu_types": {}}]},
}
CPU_SHAPE = {"tasks": 1, "cpus_per_task": 1, "mem_mb_per_node": 1000, "runtime": 60}


def job(label, runtime=60, **shape):
    return (label, {"slurm_account": "def-x_cpu", "runtime": runtime, "mem_mb": 1000,
                    "cpus_per_task": 1}, 1, {**CPU_SHAPE, "runtime": runtime, **shape})


def test_a_sweep_of_alike_jobs_asks_once_and_is_told_where_they_go():
    asked = []
    jobs = [job(f"run cpu_lr{i}") for i in range(1000)]
    verdict = ask_slurm(jobs, SITE, {}, ask=lambda flags: asked.append(flags) or
                        reply(PLACED, ok=True))
    assert len(asked) == 1 and verdict.answered and verdict.errors == []
    assert verdict.lines == ["where Slurm places each job (sbatch --test-only, 1 distinct "
                             "request(s)): run cpu_lr0 (and 999 more alike) -> partition "
                             "cpubase_bycore_b1 (nodes vm)"]


def test_slurms_refusal_is_the_plans_in_its_own_words():
    verdict = ask_slurm([job("run cpu", runtime=2000)], SITE,
                        {"run cpu": "resources.runtime 2000 min of run cpu is above ..."},
                        ask=lambda flags: reply(ROUTE_REFUSED))
    [error] = verdict.errors
    assert error.startswith("run cpu: Slurm refuses it: No partition takes a cpu job of 2000 "
                            "minutes: the longest takes 1440 minutes (sbatch --test-only "
                            "--export=ALL -A def-x_cpu -t 2000 --mem 1000 --ntasks=1 "
                            "--cpus-per-task=1); resources.runtime 2000 min of run cpu")


def test_a_full_queue_now_is_a_wait_not_a_refusal_and_a_silent_controller_says_nothing():
    """sbatch --test-only answers AssocMaxSubmitJobLimit while the user's other jobs fill
    the submit limit: the plan is not refused (its submissions wait for room); where
    slurmctld does not answer, the plan is left unchecked, not refused."""
    full = reply("sbatch: error: AssocMaxSubmitJobLimit\nsbatch: error: Batch job submission "
                 "failed: Job violates accounting/QOS policy (job submit limit, user's size "
                 "and/or time limits)")
    verdict = ask_slurm([job("run cpu")], SITE, {}, ask=lambda flags: full)
    assert verdict.errors == [] and verdict.answered
    [note] = verdict.notes
    assert note.startswith("run cpu: your share of Slurm's queue is full now (")
    assert note.endswith("its submissions will wait for one of your jobs to leave the queue "
                         "(no try spent)")
    silent = reply("sbatch: error: Batch job submission failed: Unable to contact slurm "
                   "controller (connect failure)")
    verdict = ask_slurm([job("run cpu")], SITE, {}, ask=lambda flags: silent)
    assert (verdict.errors, verdict.notes, verdict.answered) == ([], [], False)


def test_a_job_slurm_takes_but_places_where_it_never_starts_is_refused():
    """EnforcePartLimits=NO: a 300-minute job is taken in a 180-minute partition, and pends
    forever there."""
    verdict = ask_slurm([job("run cpu", runtime=300)], SITE, {},
                        ask=lambda flags: reply(PLACED, ok=True))
    [error] = verdict.errors
    assert error.startswith("Slurm places run cpu in partition cpubase_bycore_b1, where it can "
                            "never start: resources.runtime 300 min of run cpu is above "
                            "partition cpubase_bycore_b1's MaxTime of 180 min")


def test_where_the_plans_reading_refused_and_slurm_takes_it_slurm_wins():
    verdict = ask_slurm([job("run cpu")], SITE, {"run cpu": "run cpu has no partition to run in"},
                        ask=lambda flags: reply(PLACED, ok=True))
    assert verdict.errors == [] and verdict.notes == [
        "the plan's reading of the partitions refused run cpu (run cpu has no partition to run "
        "in); Slurm accepts it in partition cpubase_bycore_b1: going by Slurm"]


def node(name, gpus=0):
    return {"name": name, "cpus": 2, "mem_mb": 20000, "gpus": gpus,
            "gpu_types": {"h100": gpus} if gpus else {}}


def partition(name, nodes, minutes=1440, **access):
    return {"name": name, "max_time_min": minutes, "up": True, "hidden": False,
            "default": False, "max_nodes": None, "max_cpus_per_node": None,
            "max_mem_per_node": None, "nodes": nodes, "allow_accounts": None,
            "deny_accounts": set(), "allow_groups": None, **access}


def test_on_a_site_where_every_node_has_a_gpu_cpu_jobs_have_partitions():
    site = {"gpu_b3": partition("gpu_b3", [node("g1", 4), node("g2", 4)])}
    assert [p["name"] for p in candidates(site, "", gpu=False)[0]] == ["gpu_b3"]
    assert check_fit({"run cpu": CPU_SHAPE}, "", site) == []
    mixed = {**site, "cpu_b3": partition("cpu_b3", [node("c1")])}
    assert [p["name"] for p in candidates(mixed, "", gpu=False)[0]] == ["cpu_b3"]


def test_partitions_closed_to_the_account_are_no_place_for_its_jobs():
    site = {"cpu_b3": partition("cpu_b3", [node("c1")]),
            "long": partition("long", [node("c1")], minutes=43200,
                              allow_accounts={"def-other_cpu"})}
    shape = {**CPU_SHAPE, "runtime": 20000}
    accounts = {False: "def-x_cpu"}
    # today: the long partition of another account was counted, and 20,000 min passed
    [error] = check_fit({"run cpu": shape}, "", site, accounts)
    assert "above partition cpu_b3's MaxTime of 1440 min" in error
    assert check_fit({"run cpu": shape}, "", site, {False: "def-other_cpu"}) == []
    [named] = check_fit({"run cpu": CPU_SHAPE}, "long", site, accounts)
    assert named.startswith("partition long does not take jobs of account def-x_cpu or your "
                            "groups (AllowAccounts def-other_cpu, AllowGroups ALL)")
    groups = {"c": partition("c", [node("c1")], allow_groups={"physics"})}
    assert job_error("run cpu", CPU_SHAPE, "", groups, accounts, {"chem"}).startswith(
        "run cpu has no partition to run in")
    assert job_error("run cpu", CPU_SHAPE, "", groups, accounts, {"physics", "chem"}) is None


def test_partition_default_means_let_the_site_route():
    site = {"cpu_b3": partition("cpu_b3", [node("c1")])}
    assert check_fit({"run cpu": CPU_SHAPE}, "default", site) == []
    assert check_fit({"run cpu": CPU_SHAPE}, "nosuch", site)[0].startswith(
        "slurm.partition nosuch is not a partition of this cluster")


def test_a_qos_the_user_is_not_in_limits_someone_else(monkeypatch):
    answers = {"assoc": "100|normal\n100|normal,high\n", "qos": "normal|\nhigh|50\ntight|2\n"}
    monkeypatch.setattr(slurm, "ask", lambda argv, timeout_s=None: slurm.Reply(
        tuple(argv), "ok", answers["qos" if "qos" in argv else "assoc"]))
    slurm.submit_limits.cache_clear()
    try:
        assert sorted(slurm.submit_limits("me")) == [50, 100, 100]  # not tight's 2
    finally:
        slurm.submit_limits.cache_clear()
