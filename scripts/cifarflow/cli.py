"""The command the workflow rules call: ``cifarflow <command> ...`` (or ``python -m cifarflow``).

Errors a user can fix end the process with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .orders import FusedOrder, PackOrder, SegmentOrder

START = time.time()


def cmd_fetch_data(a) -> None:
    from . import data

    synthetic = {k: getattr(a, k) for k in ("train_size", "test_size", "seed", "noise")
                 if getattr(a, k) is not None}
    path = data.prepare_archive(a.source, Path(a.out_dir), url=a.url, md5=a.md5,
                                archive=a.archive, synthetic=synthetic, data_id=a.data_id)
    print(f"dataset archive ready: {path}")


def cmd_extract_data(a) -> None:
    from . import data

    archive = Path(a.archive)
    data.verify_archive(archive, data.expected_md5(archive, a.data_id, a.md5))
    batches = data.extract_archive(archive, Path(a.out_dir))
    print(f"extracted and checked {batches}")


def cmd_train(a) -> dict:
    from .job.one_try import train_segment

    return train_segment(SegmentOrder.from_args(a), START)


def cmd_train_pack(a) -> None:
    from .job.pack import run_pack

    sys.exit(run_pack(PackOrder.from_args(a)))


def cmd_train_fused(a) -> None:
    from .job.fused_pack import train_fused_members

    sys.exit(train_fused_members(FusedOrder.from_args(a), start_time=START))


def cmd_record_env(a) -> None:
    from .job.environment import record_environment

    record_environment(Path(a.out), Path(a.freeze), a.expect_gpu)


def cmd_aggregate(a) -> None:
    from .results.aggregate import aggregate

    runs = json.loads(Path(a.runs).read_text())
    aggregate(runs, Path(a.out_dir), Path(a.plots_dir or Path(a.out_dir) / "plots"),
              keep_missing=a.keep_missing, environment=Path(a.env) if a.env else None,
              study=Path(a.study) if a.study else None,
              results=Path(a.results) if a.results else None)


def cmd_dashboard(a) -> None:
    from .controller.optional_packages import not_installed
    from .results.study import journal_of, serve_dashboard

    journal = Path(a.results) if Path(a.results).is_file() else journal_of(a.results)
    if journal is None:
        raise SystemExit(f"cifarflow dashboard: no study under {a.results} (sweep.search writes "
                         f"{a.results}/search/study.journal)")
    lacking = not_installed("optuna-dashboard")
    if lacking:
        raise SystemExit(f"cifarflow dashboard: {lacking}")
    serve_dashboard(journal, a.host, a.port)


def cmd_install_optional(a) -> None:
    from .controller.optional_packages import install_optional

    install_optional((["--no-index"] if a.no_index else [])
                     + (["--find-links", a.find_links] if a.find_links else []))


def cmd_show(a) -> None:
    from .results.show import show

    print(show(Path(a.results), top=a.top, digest=a.digest))


def cmd_compare(a) -> None:
    from .results.compare import compare, describe

    result = compare(Path(a.a), Path(a.b))
    print(describe(result, Path(a.a), Path(a.b)))
    sys.exit(0 if result.all_match else 1)


def cmd_controller_job(a) -> None:
    from .controller.controller_job import main as controller_job

    controller_job(a, Path(__file__).resolve().parents[2])


def cmd_mps_run(a) -> None:
    from .job.mps_daemon import run_with_mps

    sys.exit(run_with_mps(a.command, replicas=a.replicas, dry_run=a.dry_run))


def parser() -> argparse.ArgumentParser:
    from .data import CIFAR_MD5, CIFAR_URL

    p = argparse.ArgumentParser(prog="cifarflow", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    f = sub.add_parser("fetch-data", help="download / link / synthesise the tarball")
    f.add_argument("--source", choices=["download", "archive", "synthetic"], required=True)
    f.add_argument("--out-dir", required=True)
    f.add_argument("--url", default=CIFAR_URL)
    f.add_argument("--md5", default=CIFAR_MD5)
    f.add_argument("--archive", default=None)
    f.add_argument("--train-size", type=int, help="synthetic: training images")
    f.add_argument("--test-size", type=int, help="synthetic: test images")
    f.add_argument("--seed", type=int, help="synthetic: generator seed")
    f.add_argument("--noise", type=float, help="synthetic: pixel noise (fraction of 255)")
    f.add_argument("--data-id", default=None, help="the config's data id, recorded beside the "
                   "tarball (default: computed from these options)")
    f.set_defaults(func=cmd_fetch_data)

    e = sub.add_parser("extract-data", help="verify and extract the tarball")
    e.add_argument("--archive", required=True)
    e.add_argument("--md5", default=CIFAR_MD5)
    e.add_argument("--data-id", required=True, help="the config's data id: the tarball must "
                   "have been fetched for it (a md5, or synthetic-<hash of its parameters>)")
    e.add_argument("--out-dir", required=True)
    e.set_defaults(func=cmd_extract_data)

    for order in (SegmentOrder, PackOrder, FusedOrder):  # a job's order: orders.py
        o = sub.add_parser(order.COMMAND, help=order.HELP)
        order.add_arguments(o)
        o.set_defaults(func={"train": cmd_train, "train-pack": cmd_train_pack,
                             "train-fused": cmd_train_fused}[order.COMMAND])

    r = sub.add_parser("record-env", help="write the software environment")
    r.add_argument("--out", required=True)
    r.add_argument("--freeze", required=True)
    r.add_argument("--expect-gpu", action="store_true",
                   help="fail unless torch sees a GPU it has kernels for")
    r.set_defaults(func=cmd_record_env)

    g = sub.add_parser("aggregate", help="summary table, plots and advice")
    g.add_argument("--runs", required=True, help="the runs' JSON file (written by the workflow)")
    g.add_argument("--out-dir", required=True)
    g.add_argument("--plots-dir", default=None)
    g.add_argument("--keep-missing", action="store_true")
    g.add_argument("--results", default=None, help="the results folder, whose record names "
                   "the jobs cancelled from outside (default: --out-dir)")
    g.add_argument("--env", default=None, help="environment.json (record-env): the CPU's "
                   "features, for the bf16 advice")
    g.add_argument("--study", default=None, help="the search's study journal (sweep.search): "
                   "its history and parameter importances join the summary")
    g.set_defaults(func=cmd_aggregate)

    d = sub.add_parser("dashboard", help="serve the search's study (sweep.search) with "
                       "optuna-dashboard")
    d.add_argument("results", nargs="?", default="results", help="the results directory (or "
                   "the journal file itself)")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, default=None, help="default: a free port, printed with "
                   "the `ssh -L` line that reaches it")
    d.set_defaults(func=cmd_dashboard)

    o = sub.add_parser("install-optional", help="pip install requirements-optional.txt's "
                       "packages one by one (lightning, tensorboard, ...): says which are missing")
    o.add_argument("--no-index", action="store_true", help="the site's wheelhouse only (Alliance)")
    o.add_argument("--find-links", default="", help="a folder of wheels of your own")
    o.set_defaults(func=cmd_install_optional)

    s = sub.add_parser("show", help="the results at a glance: run, strategy, test_acc, "
                       "images/s, wall, status and the advice's verdict, best first")
    s.add_argument("results", nargs="?", default="results", help="the results directory (or "
                   "results/partial, or a summary.csv)")
    s.add_argument("--top", type=int, default=20, help="runs shown, most accurate first (0: all)")
    s.add_argument("--digest", action="store_true", help="each run's weights_sha256 too (its "
                   "final weights' fingerprint)")
    s.set_defaults(func=cmd_show)

    k = sub.add_parser("compare", help="which runs of two results folders ended with "
                       "bit-identical weights (weights_sha256); exit 0 when all common runs do")
    k.add_argument("a", help="a results directory (or its summary.csv)")
    k.add_argument("b", help="the other")
    k.set_defaults(func=cmd_compare)

    c = sub.add_parser("controller-job", help="run the workflow's Snakemake as a 1-core Slurm "
                       "job (not on the login node) and follow its log: controller-job "
                       "[options] -- SNAKEMAKE_ARGS")
    c.add_argument("--account", default="", help="who pays (default slurm.account of the "
                   "config, --configfile among SNAKEMAKE_ARGS else config/config.yaml, else "
                   "$SLURM_ACCOUNT; def-x becomes def-x_cpu where the site splits accounts)")
    c.add_argument("--time", default=None, help="its time limit (default: the longest "
                   "partition a 1-core job can be routed to)")
    c.add_argument("--mem-mb", type=int, default=4000, help="its memory (MB)")
    c.add_argument("--no-follow", action="store_true", help="submit and return")
    c.add_argument("snakemake_args", nargs=argparse.REMAINDER,
                   help="after --: snakemake's arguments (--profile profiles/slurm is added "
                   "unless given)")
    c.set_defaults(func=cmd_controller_job)

    sub.add_parser("launch", help="start N ranks with srun (Slurm) or torchrun: "
                   "launch --nproc N [--self-spawning] -- COMMAND")

    m = sub.add_parser("mps-run", help="run a command under a private NVIDIA MPS daemon")
    m.add_argument("--replicas", type=int, required=True)
    m.add_argument("--dry-run", action="store_true")
    m.add_argument("command", nargs=argparse.REMAINDER)
    m.set_defaults(func=cmd_mps_run)
    return p


# the subcommands that train: they listen for Slurm's stop signals before importing torch
TRAINING_COMMANDS = ("train", "train-pack", "train-fused")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in TRAINING_COMMANDS:  # before torch imports: no notice is lost
        from .engine import stop_signals

        stop_signals.listen()
    if argv[:1] == ["launch"]:  # its own parser (everything after -- is the command); fast
        from .job.launch import main as launch_main

        return launch_main(argv[1:])
    from .job.one_try import user_error_types

    args = parser().parse_args(argv)
    user_errors = user_error_types()
    try:
        args.func(args)
    except user_errors as exc:
        print(f"cifarflow {args.command}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    if args.command == "train":
        # Everything is written, fsync'ed and published, the process group is gone: skip
        # the interpreter's teardown of torch's module graph (1.3 s of every segment).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
