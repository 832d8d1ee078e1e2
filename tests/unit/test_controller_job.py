"""`cifarflow controller-job`: the controller's own job (1 core, the longest time a routed
1-core job may have, the workflow's profile) and the follower that prints its log."""

import io
from pathlib import Path

from cifarflow import slurm

from cifarflow.controller.controller_job import (follow, given_account, longest_cpu_time,
                                                 sbatch_argv, snakemake_argv)

# partitions as the plan reads them (partitions.partition_capacity) on an Alliance-shaped site
def partition(name, minutes, up=True, hidden=False, gpus=0):
    return {"name": name, "max_time_min": minutes, "up": up, "hidden": hidden,
            "default": False, "nodes": [{"gpus": gpus}]}


PARTITIONS = {p["name"]: p for p in (
    partition("cpubase_bycore_b1", 180), partition("cpubase_bycore_b3", 1440),
    partition("cpubase_bycore_b5", 10080, up=False), partition("urgent", None, hidden=True),
    partition("gpubase_bygpu_b5", 10080, gpus=4))}


def no_answer(flags):
    return slurm.Reply(("sbatch",), "missing", detail="sbatch: not found")


def routes_cpu_jobs_up_to(limit, longest="cpubase_bycore_b3"):
    """An Alliance-like site: a 1-core job of at most ``limit`` minutes is taken, in
    cpubase_bycore_b1 up to 3 h, else in ``longest``."""
    def ask(flags):
        minutes = int(next(f for f in flags if f.startswith("--time="))[7:])
        if minutes > limit:
            return slurm.Reply(("sbatch",), "failed", stderr="sbatch: error: No partition "
                               f"takes a cpu job of {minutes} minutes\n")
        where = "cpubase_bycore_b1" if minutes <= 180 else longest
        return slurm.Reply(("sbatch",), "ok", stderr=f"sbatch: Job 7 to start at 2026-12-07T13"
                           f":00:00 using 1 processors on nodes vm in partition {where}\n")
    return ask


def test_the_controller_asks_slurm_the_longest_time_of_a_partition_it_can_be_routed_to():
    # not the down one, the hidden one nor the GPU one; the longest asked first
    asked = []
    site = routes_cpu_jobs_up_to(1440)
    assert longest_cpu_time(PARTITIONS, ask=lambda f: asked.append(f) or site(f)) == 1440
    assert [f[-1] for f in asked] == ["--time=1440"]
    # the site routes no 1-core job of a day: 3 h
    assert longest_cpu_time(PARTITIONS, ask=routes_cpu_jobs_up_to(180)) == 180
    # taken for a day, but placed where it never starts (MaxTime 180): not a day
    assert longest_cpu_time(PARTITIONS, ask=routes_cpu_jobs_up_to(1440, "cpubase_bycore_b1")) \
        == 180
    # no answer from sbatch: the partitions as read
    assert longest_cpu_time(PARTITIONS, ask=no_answer) == 1440
    assert longest_cpu_time(PARTITIONS, named="cpubase_bycore_b1", ask=no_answer) == 180
    assert longest_cpu_time(PARTITIONS, named="urgent") is None  # unlimited: Slurm's default
    assert longest_cpu_time(None) is None
    # a site where every node has a GPU: its partitions take CPU jobs too
    gpu_site = {"gpubase_bygpu_b5": partition("gpubase_bygpu_b5", 10080, gpus=4)}
    assert longest_cpu_time(gpu_site, ask=no_answer) == 10080


def test_the_controller_runs_this_environments_snakemake_with_the_slurm_profile():
    base, bin_dir = Path("/w"), Path("/venv/bin")
    assert snakemake_argv(["-n"], base, bin_dir) == [
        "/venv/bin/snakemake", "--profile", "/w/profiles/slurm", "-n"]
    mine = ["--profile=/mine", "all"]
    assert snakemake_argv(mine, base, bin_dir) == ["/venv/bin/snakemake", *mine]


def test_the_controller_job_is_one_core_with_its_account_time_and_log():
    argv = sbatch_argv(["/venv/bin/snakemake", "--configfile", "my config.yaml"],
                       account="def-x_cpu", time_limit="1-00:00:00", mem_mb=4000,
                       workdir=Path("/w"), log=Path("/w/.snakemake/controller/c.log"))
    assert argv[:9] == ["sbatch", "--parsable", "--job-name=cifarflow-controller",
                        "--ntasks=1", "--cpus-per-task=1", "--mem=4000", "--chdir=/w",
                        "--output=/w/.snakemake/controller/c.log", "--open-mode=append"]
    assert "--account=def-x_cpu" in argv and "--time=1-00:00:00" in argv
    assert argv[-2:] == ["--wrap", "exec /venv/bin/snakemake --configfile 'my config.yaml'"]
    bare = sbatch_argv(["s"], account="", time_limit=None, mem_mb=1, workdir=Path("/w"),
                       log=Path("/l"))
    assert not any(a.startswith(("--account", "--time")) for a in bare)


def test_the_follower_prints_the_log_as_it_grows_and_returns_the_final_state(tmp_path):
    log = tmp_path / "c.log"
    states = iter(["PENDING", "RUNNING", "RUNNING", "COMPLETED"])
    written = iter(["", "Building DAG\n", "1 of 2 steps\n", "2 of 2 steps (100%) done\n"])

    def state_of(job):
        assert job == "42"
        with open(log, "a") as f:
            f.write(next(written))
        return next(states)

    out = io.StringIO()
    assert follow("42", log, out=out, poll_s=0, state_of=state_of) == "COMPLETED"
    assert out.getvalue() == "Building DAG\n1 of 2 steps\n2 of 2 steps (100%) done\n"


def test_the_controller_job_pays_with_the_config_s_account(tmp_path):
    """--account, else slurm.account of the config the workflow reads (the --configfile
    among the Snakemake arguments over config/config.yaml), else $SLURM_ACCOUNT."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("slurm:\n  account: def-base\n")
    (tmp_path / "mine.yaml").write_text("slurm:\n  account: def-mine\n")
    (tmp_path / "other.yaml").write_text("train:\n  epochs: 2\n")
    env = {"SLURM_ACCOUNT": "def-env"}
    assert given_account("", ["-n"], tmp_path, env) == "def-base"
    assert given_account("", ["--configfile", "mine.yaml", "-n"], tmp_path, env) == "def-mine"
    assert given_account("", ["--configfile=other.yaml"], tmp_path, env) == "def-base"
    assert given_account("", ["--configfiles", "mine.yaml", "other.yaml"], tmp_path,
                         env) == "def-mine"
    assert given_account("def-opt", ["--configfile", "mine.yaml"], tmp_path, env) == "def-opt"
    (tmp_path / "config" / "config.yaml").write_text("slurm:\n  account: ''\n")
    assert given_account("", [], tmp_path, env) == "def-env"
