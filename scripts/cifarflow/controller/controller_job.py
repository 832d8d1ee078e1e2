"""The controller as a Slurm job of its own (`cifarflow controller-job`): a sweep's Snakemake
runs for days, re-plans after every checkpoint and aggregates at the end, which sites do not
want on a login node (they cap its CPU and memory). This submits that Snakemake as a 1-core
long job that submits the training jobs itself (sbatch works from inside a job; the executor
plugin drops the job's SLURM_* variables first), then follows its log on the terminal until
it ends and exits with its status. Ctrl-C stops the following, not the workflow. No torch.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import yaml

from .. import slurm
from .accounts import job_accounts
from .partitions import read_partitions
from .routing import candidates
from .sites import Site, current as current_site

JOB_NAME = "cifarflow-controller"
LOG_DIR = ".snakemake/controller"  # beside Snakemake's own logs, in the working directory
DEFAULT_MEM_MB = 4000  # Snakemake's DAG of a 1000-run sweep and the aggregation's tables
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def longest_cpu_time(partitions: dict[str, dict] | None, named: str = "", account: str = "",
                     mem_mb: int = DEFAULT_MEM_MB, ask=slurm.will_run) -> int | None:
    """The longest MaxTime (minutes) a 1-core job of this account is taken for: each
    partition's MaxTime it may be routed to, longest first, asked of Slurm (sbatch
    --test-only: the site's routing decides, and a MaxTime Slurm would take but never start
    does not count); where Slurm does not answer, the longest of them. None where one has no
    limit or Slurm does not say."""
    from .will_run import read_answer

    if not partitions:
        return None
    places, _ = candidates(partitions, named, gpu=False, account=account or None)
    times = [p["max_time_min"] for p in places]
    if not times or None in times:  # unlimited: the partition's default time is the job's
        return None
    for minutes in sorted(set(times), reverse=True):
        flags = ["--ntasks=1", "--cpus-per-task=1", f"--mem={mem_mb}", f"--time={int(minutes)}"]
        flags += [f"--account={account}"] if account else []
        flags += [f"--partition={named}"] if named else []
        answer = read_answer(ask(flags))
        if not answer.asked:
            break  # no answer: the partitions as read decide
        there = partitions.get(answer.partition, {}).get("max_time_min")
        if not answer.reason and (there is None or there >= minutes):
            return int(minutes)
    else:
        return None  # Slurm takes a 1-core job for none of them: its default time
    return int(max(times))


def snakemake_argv(args: list[str], basedir: Path, bin_dir: Path) -> list[str]:
    """The controller's command: this environment's snakemake with the user's arguments, and
    the workflow's Slurm profile unless they name a profile."""
    argv = [str(bin_dir / "snakemake"), *args]
    if not any(a == "--profile" or a.startswith("--profile=") for a in args):
        argv[1:1] = ["--profile", str(basedir / "profiles" / "slurm")]
    return argv


def sbatch_argv(command: list[str], *, account: str, time_limit: str | int | None, mem_mb: int,
                workdir: Path, log: Path) -> list[str]:
    """One 1-core job running the controller in the working directory, its output in `log`."""
    argv = ["sbatch", "--parsable", f"--job-name={JOB_NAME}", "--ntasks=1",
            "--cpus-per-task=1", f"--mem={mem_mb}", f"--chdir={workdir}",
            f"--output={log}", "--open-mode=append"]
    if account:
        argv.append(f"--account={account}")
    if time_limit:
        argv.append(f"--time={time_limit}")
    # exec: Slurm's signals (time limit, scancel) reach Snakemake itself, which then stops
    # and leaves its jobs as a lost login session would (docs/slurm.md)
    return argv + ["--wrap", "exec " + shlex.join(command)]


def follow(job: str, log: Path, out=sys.stdout, poll_s: float = 2.0,
           state_of=slurm.job_state) -> str:
    """Print the controller's log as it grows until its job has ended; its final state."""
    offset = 0
    while True:
        state = state_of(job)
        if log.is_file():
            with open(log, errors="replace") as f:
                f.seek(offset)
                text = f.read()
                offset = f.tell()
            if text:
                out.write(text)
                out.flush()
        if state in FINISHED:
            return state
        time.sleep(poll_s)


def submit(args: list[str], *, account: str, time_limit: str | int | None, mem_mb: int,
           basedir: Path, workdir: Path, bin_dir: Path, follow_log: bool = True) -> int:
    """Submit the controller job; follow it where asked. The exit status: 0 when the
    workflow ended well (or was only submitted), 1 when its job did not."""
    if time_limit is None:
        time_limit = longest_cpu_time(read_partitions(), os.environ.get("SLURM_PARTITION", ""),
                                      account, mem_mb)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    log = (workdir / LOG_DIR / f"controller-{stamp}.log").resolve()
    log.parent.mkdir(parents=True, exist_ok=True)
    command = snakemake_argv(args, basedir, bin_dir)
    reply = slurm.ask(sbatch_argv(command, account=account, time_limit=time_limit,
                                  mem_mb=mem_mb, workdir=workdir.resolve(), log=log))
    if not reply.ok:
        print(f"cifarflow controller-job: sbatch refused the controller job: {reply.detail}",
              file=sys.stderr)
        return 1
    job = reply.stdout.strip().split(";")[0]
    print(f"[controller-job] Slurm job {job} runs the workflow: {shlex.join(command)}\n"
          f"[controller-job] its log: {log}\n"
          f"[controller-job] scancel {job} stops it (its training jobs stay, as after a lost "
          "login session; run this again to take them over)", flush=True)
    if not follow_log:
        return 0
    try:
        state = follow(job, log)
    except KeyboardInterrupt:
        print(f"\n[controller-job] no longer following job {job}; it goes on (tail -f {log})")
        return 0
    print(f"[controller-job] Slurm job {job} ended {state}", flush=True)
    return 0 if state == "COMPLETED" else 1


def cpu_account(given: str, user: str) -> str:
    """The account a 1-core job goes to, as the plan maps every job's (accounts.py): def-x is
    def-x_cpu where the site splits them; raises ValueError where sbatch would refuse it."""
    listed = slurm.user_accounts(user)
    if listed is None:  # no accounting: sbatch and the site decide
        return given
    return job_accounts(given, listed, {False})[0][False]


CONFIG_FILE = "config/config.yaml"  # the Snakefile's configfile:, in the working directory


def config_files(args: list[str], workdir: Path) -> list[Path]:
    """The config files the workflow reads, in order: the Snakefile's config/config.yaml,
    then each --configfile(s) of the Snakemake arguments (later ones win, as in Snakemake)."""
    files, taking = [workdir / CONFIG_FILE], False
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in ("--configfile", "--configfiles"):
            taking = not eq
            files += [workdir / value] if eq else []
        elif taking and not arg.startswith("-"):
            files.append(workdir / arg)
        else:
            taking = False
    return files


def configured_account(args: list[str], workdir: Path) -> str:
    """slurm.account as the workflow will read it from its config files ("" where none sets
    it); a file that is not there is Snakemake's to refuse."""
    account = ""
    for path in config_files(args, workdir):
        if path.is_file():
            slurm_section = (yaml.safe_load(path.read_text()) or {}).get("slurm") or {}
            account = slurm_section.get("account") or account
    return account


def given_account(option: str, args: list[str], workdir: Path, environ=os.environ) -> str:
    """The controller's account as the workflow places its jobs (placement.py): --account,
    else slurm.account of the config the user passes, else $SLURM_ACCOUNT."""
    return (option or configured_account(args, workdir)
            or environ.get("SLURM_ACCOUNT", ""))


def no_jobs_from_jobs(site: Site) -> str:
    """The refusal where the site's jobs cannot submit jobs, with the way out."""
    return (f"cifarflow controller-job: on {site.name} jobs cannot submit jobs ({site.docs}), "
            "so a controller job could never submit the training jobs: run the controller on "
            "the login node instead, in a session that outlives your connection and at low "
            "priority, e.g. `tmux new -s sweep` then `nice snakemake --profile "
            "profiles/slurm` (detach with Ctrl-b d, come back with `tmux attach -t sweep`)")


def main(args, basedir: Path) -> None:
    """`cifarflow controller-job`: the CLI's arguments, parsed."""
    site = current_site()
    if not site.jobs_may_submit:
        print(no_jobs_from_jobs(site), file=sys.stderr)
        sys.exit(2)
    rest = args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args
    account = cpu_account(given_account(args.account, rest, Path.cwd()), slurm.user())
    sys.exit(submit(rest, account=account, time_limit=args.time,
                    mem_mb=args.mem_mb, basedir=basedir, workdir=Path.cwd(),
                    bin_dir=Path(sys.executable).parent, follow_log=not args.no_follow))
