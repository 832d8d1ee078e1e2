"""Shared fixtures: small synthetic CIFAR data on disk, and helpers that run the real
CLI, torchrun and snakemake as subprocesses."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import time
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from cifarflow import data  # noqa: E402
from cifarflow.config import with_defaults  # noqa: E402
from cifarflow.controller.plan import build_runs  # noqa: E402

PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), "PYTHONUNBUFFERED": "1"}
ENV.pop("SLURM_JOB_ID", None)
SYNTHETIC = {"train_size": 2000, "test_size": 400}  # the cifar_dir fixture's data


# tests/gpu under `make test` (tests/suite.sh sets it where CUDA is available): a skip is a
# failure there, since on a GPU machine a skipped GPU test is a path nobody ran.
# bench/gpu_check.py counts skips itself and leaves the variable unset. (Here, not in a
# tests/gpu/conftest.py: that one would be the `conftest` test_gpu.py imports its helpers from.)
GPU_SKIP_FAILS = "CIFARFLOW_GPU_SKIP_FAILS"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get(GPU_SKIP_FAILS) == "1":
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped on a machine with a GPU ({GPU_SKIP_FAILS}=1): {reason}"


def pytest_configure(config):
    config.addinivalue_line("markers", "slurm: needs the local Slurm cluster (tests/slurm/cluster.sh)")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (tests/gpu; make gpu-check)")
    config.addinivalue_line("markers", "slow: a whole workflow run of a quarter of a minute or "
                            "more, or a costlier variant of what a faster test proves (make "
                            "test runs it but for the `variant` ones, make test-fast does not)")
    config.addinivalue_line("markers", "variant: a costlier variant of a claim a cheaper test "
                            "of make test already proves (another strategy, a second path to "
                            "the same mechanism): make test-all runs it, make test (CI) does not")


@pytest.fixture
def deterministic_switches_restored():
    """torch's process-wide deterministic switches, as they were before the test."""
    import torch
    import torch.utils.deterministic

    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory)
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.utils.deterministic.fill_uninitialized_memory = saved[2]


@pytest.fixture(scope="session")
def cifar_dir(tmp_path_factory) -> Path:
    """cifar-10-batches-py with 2000 train / 400 test synthetic images, via the real
    fetch + extract path."""
    root = tmp_path_factory.mktemp("data")
    archive = data.prepare_archive("synthetic", root, synthetic=SYNTHETIC)
    data.verify_archive(archive, data.expected_md5(archive, data.fetch_record(archive)["data_id"],
                                                  data.CIFAR_MD5))
    return data.extract_archive(archive, root)


@contextlib.contextmanager
def served_tarball(root: Path, seed: int = 7, **sizes):
    """A CIFAR-format tarball (other data than the synthetic default), extracted beside it,
    served over HTTP by a local http.server: what data.source download fetches through the
    real download code. Yields the tarball and its URL."""
    import functools
    import http.server
    import threading

    archive = data.prepare_archive("synthetic", root, synthetic={**sizes, "seed": seed})
    data.extract_archive(archive, root)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield archive, f"http://127.0.0.1:{server.server_address[1]}/{data.ARCHIVE_NAME}"
    finally:
        server.shutdown()


def cli(*args, check=True, timeout=600, env=None, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([PY, "-m", "cifarflow", *map(str, args)], env=env or ENV, capture_output=True,
                         text=True, timeout=timeout, **kw)
    if check and out.returncode != 0:
        raise AssertionError(f"cifarflow {args[0]} failed ({out.returncode}):\n"
                             f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def probe_wheel(wheelhouse: Path, name: str = "cifarflow-probe", version: str = "0.1") -> Path:
    """A small wheel of ours built into ``wheelhouse`` (`pip wheel`, offline), as a login
    node fills a wheelhouse: the folder."""
    src = wheelhouse.parent / f"src-{name}-{version}"
    module = name.replace("-", "_")
    (src / module).mkdir(parents=True, exist_ok=True)
    (src / module / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n')
    subprocess.run([PY, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(wheelhouse), str(src)], check=True,
                   capture_output=True)
    return wheelhouse


def build_wheelhouse(requirements: list[str], wheelhouse: Path) -> Path:
    """A wheelhouse holding exactly these requirements (a complete closure, each pinned), as
    a login node fills one: wheels this machine keeps on disk are linked (torch and its CUDA
    libraries: GBs), the others fetched from the package registry (`pip download`)."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    listed = wheelhouse.parent / f"{wheelhouse.name}-requirements.txt"
    listed.write_text("\n".join(requirements) + "\n")
    report = wheelhouse.parent / f"{wheelhouse.name}-report.json"
    subprocess.run([PY, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                    "--no-deps", "--report", str(report), "-r", str(listed)], check=True,
                   capture_output=True, timeout=600)
    fetch = []
    for item in json.loads(report.read_text())["install"]:
        url = item["download_info"]["url"]
        if url.startswith("file://"):
            local = Path(url.removeprefix("file://"))
            if not (wheelhouse / local.name).exists():
                (wheelhouse / local.name).symlink_to(local)
        else:
            meta = item["metadata"]
            fetch.append(f"{meta['name']}=={meta['version']}")
    if fetch:
        subprocess.run([PY, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheelhouse),
                        *fetch], check=True, capture_output=True, timeout=1200)
    return wheelhouse


DISTRIBUTED_KEYS = ("world_size", "nodes", "device", "backend", "lr_scaling")
SEGMENT_KEYS = ("budget_s", "margin_s", "elastic")
EVAL_KEYS = ("tta",)
SPECS = Path(tempfile.mkdtemp(prefix="cifarflow-specs-"))


def spec(strategy: str = "cpu", **kw) -> Path:
    """A run's spec.json, planned by plan.py exactly as the workflow plans it; kw are
    train keys, or distributed/segments/eval keys by name. Data: the cifar_dir fixture's."""
    config = {"strategies": [strategy], "train": {"epochs": 2, "batch_size": 100, "lr": 0.05,
              "eval_batch_size": 400, "log_interval_s": 1000},
              "data": {"synthetic": SYNTHETIC}, "distributed": {}, "segments": {}, "eval": {}}
    for key, value in kw.items():
        section = ("distributed" if key in DISTRIBUTED_KEYS else
                   "segments" if key in SEGMENT_KEYS else
                   "eval" if key in EVAL_KEYS else "train")
        config[section][key] = value
    cfg = build_runs(with_defaults(config))[strategy].config
    path = SPECS / f"{hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()[:16]}.json"
    cfg.write(path)
    return path


def train(data_dir, out, threads=2, nproc=1, spec_kw=None, **kw) -> subprocess.CompletedProcess:
    args = ["train", "--spec", spec(**(spec_kw or {})), "--data", data_dir, "--out", out,
            "--threads", threads]
    for key, value in kw.items():
        args += [f"--{key.replace('_', '-')}", value]
    if nproc > 1:
        self_spawning = ["--self-spawning"] if (spec_kw or {}).get("strategy") == "lightning" else []
        args = ["launch", "--nproc", nproc, *self_spawning, "--", PY, "-m", "cifarflow", *args]
    return cli(*args)


def state_of(directory) -> dict:
    import torch

    return torch.load(Path(directory) / "state.pt", map_location="cpu", weights_only=False)


def metrics_of(directory) -> list[dict]:
    return [json.loads(l) for l in (Path(directory) / "metrics.jsonl").read_text().splitlines()]


DETERMINISTIC_KEYS = ("epoch", "train_loss", "train_acc", "test_acc", "lr")


def same_metrics(a: list[dict], b: list[dict]) -> bool:
    return [{k: r[k] for k in DETERMINISTIC_KEYS} for r in a] == \
           [{k: r[k] for k in DETERMINISTIC_KEYS} for r in b]


def assert_bit_identical(sd_a: dict, sd_b: dict) -> None:
    import torch

    assert sd_a.keys() == sd_b.keys()
    for key in sd_a:
        assert torch.equal(sd_a[key], sd_b[key]), f"{key} differs"


def weights_digest(directory) -> str:
    """A published checkpoint's weights_sha256 (its manifest's), checked first against the
    digest of the weights its own files hold (engine/checkpoints/digest.py)."""
    from cifarflow.engine.checkpoints import files as ckpt
    from cifarflow.engine.checkpoints.digest import checkpoint_weights_sha256

    recorded = ckpt.read_manifest(directory, verify=False).get("weights_sha256")
    assert recorded, f"{directory}: no weights_sha256 in its manifest"
    assert recorded == checkpoint_weights_sha256(directory), \
        f"{directory}: the manifest's weights_sha256 is not that of its weights"
    return recorded


def snakemake_command(workdir: Path, *args, configfile=None, config=()) -> list[str]:
    cmd = [str(Path(PY).parent / "snakemake"), "-s", str(ROOT / "Snakefile"),
           "--directory", str(workdir)]
    if configfile:
        files = configfile if isinstance(configfile, (list, tuple)) else [configfile]
        cmd += ["--configfile", *map(str, files)]
    if config:
        cmd += ["--config", *config]
    return cmd + list(map(str, args))


def start_snakemake(workdir: Path, *args, configfile=None, env=None, **popen) -> subprocess.Popen:
    """snakemake in the background, its output captured (text); `env`: variables added."""
    return subprocess.Popen(snakemake_command(workdir, *args, configfile=configfile),
                            env={**ENV, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def snakemake(workdir: Path, *args, configfile=None, config=(), check=True, timeout=900,
              env=None) -> subprocess.CompletedProcess:
    cmd = snakemake_command(workdir, *args, configfile=configfile, config=config)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env={**ENV, **(env or {})})
    if check and out.returncode != 0:
        raise AssertionError(f"snakemake failed ({out.returncode}):\n{out.stdout[-4000:]}\n"
                             f"{out.stderr[-6000:]}")
    return out


# Slurm jobs of the tests: each workflow run a test starts names its jobs after its working
# directory (the plugin's --slurm-jobname-prefix), finds them by that name, never by a
# comment every test shares, and the own_slurm_jobs fixture cancels what is left of them.
SLURM_PREFIXES: set[str] = set()  # every prefix a test of this session used
SLURM_RUNS: list[subprocess.Popen] = []  # the snakemake runs tests started in the background
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def slurm_job_prefix(workdir: Path) -> str:
    """The job-name prefix of every Slurm job a workflow run in `workdir` submits: the
    directory's name (pytest makes it from the test's) and a hash of its whole path."""
    path = str(Path(workdir).resolve())
    name = re.sub(r"[^A-Za-z0-9_-]", "", Path(path).name)[:36]
    prefix = f"{name}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    SLURM_PREFIXES.add(prefix)
    return prefix


def slurm_jobs(prefix: str, states: str = "all") -> dict[str, tuple[str, str]]:
    """job id -> (state, comment) of the jobs named <prefix>_..., in squeue's states."""
    out = subprocess.run(["squeue", "-h", "-t", states, "-o", "%i|%j|%T|%k"],
                         capture_output=True, text=True).stdout
    jobs = {}
    for line in out.splitlines():
        jobid, name, state, comment = line.split("|", 3)
        if name.startswith(prefix + "_"):
            jobs[jobid] = (state, comment)
    return jobs


def cancel_slurm_jobs(prefixes, wait_s: float = 90) -> list[str]:
    """scancel the unfinished jobs of these prefixes (SIGSTOPped ones too: Slurm sends
    SIGCONT first) and wait until they have left the node; returns their ids."""
    live = [j for p in prefixes for j, (state, _) in slurm_jobs(p).items()
            if state not in FINISHED]
    if live:
        subprocess.run(["scancel", *live], capture_output=True)
        deadline = time.time() + wait_s
        while time.time() < deadline and any(
                state not in FINISHED for p in prefixes for j, (state, _) in
                slurm_jobs(p).items() if j in live):
            time.sleep(0.5)
    return live


@pytest.fixture(autouse=True)
def own_slurm_jobs(request):
    """After each test, none of the tests' Slurm jobs runs on: a failed test (or a failed
    module fixture before it) leaves no frozen job holding the cluster's CPUs."""
    yield
    while SLURM_RUNS:  # a test that failed before its run ended: it submits nothing more
        run = SLURM_RUNS.pop()
        if run.poll() is None:
            run.kill()
            run.communicate()
    if SLURM_PREFIXES:
        left = cancel_slurm_jobs(sorted(SLURM_PREFIXES))
        if left:
            print(f"\ncancelled Slurm jobs left by {request.node.name}: {' '.join(left)}")


def summary_rows(workdir: Path, name: str = "results/summary.csv") -> dict[str, dict]:
    """summary.csv of a finished workflow, by run name."""
    import csv

    with open(Path(workdir) / name) as f:
        return {row["run"]: row for row in csv.DictReader(f)}


def run_batches(workdir: Path, run: str) -> Path:
    """The extracted split a workflow's run trains on: results/data/<its spec's data id>/."""
    from cifarflow.data_folders import data_folder

    spec = json.loads((Path(workdir) / f"results/runs/{run}/spec.json").read_text())
    return Path(data_folder(str(Path(workdir) / "results"), spec["data_id"])) / data.BATCHES_DIR


def final_states(workdir: Path) -> dict:
    """Every run's last published segment (state.pt), by run name."""
    return {run.name: state_of(max(run.glob("segment-*"), key=lambda p: int(p.name[8:])))
            for run in sorted((Path(workdir) / "results/runs").iterdir())}


def process_tree(pid: int) -> list[int]:
    """Every process under `pid`: this test's own processes, never others on the machine."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        found = []
        for task in Path(f"/proc/{parent}/task").glob("*"):  # threads start processes too
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        out += found
        todo += found
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def training_spec(pid: int) -> str | None:
    """The --spec of a `cifarflow train` process (a Python interpreter running it, not the
    shell, tee or srun around it), else None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return None
    if not Path(argv[0]).name.startswith("python"):
        return None
    module = argv[1:3] in (["-m", "cifarflow"], ["-m", "cifarflow.__main__"])  # the latter:
    rest = argv[3:] if module else (  # how Lightning starts its other ranks
        argv[2:] if argv[1].endswith("/cifarflow") else [])
    if rest[:1] != ["train"] or "--spec" not in rest:
        return None
    return rest[rest.index("--spec") + 1]


def thread_states(pid: int) -> list[str]:
    """The state letter of each thread of `pid` (/proc/<pid>/task/*/stat); [] once it is gone."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            pass
    return states


def wait_stopped(pid: int, timeout: float = 60) -> None:
    """Until every thread of `pid` is stopped (state T): a SIGSTOP is not instant, and a
    process inside a checkpoint's rename finishes it first."""
    deadline = time.time() + timeout
    while True:
        states = thread_states(pid)
        if not states or "Z" in states or "X" in states:
            raise AssertionError(f"process {pid} ended before it stopped")
        if all(s in "Tt" for s in states):
            return
        if time.time() > deadline:
            raise AssertionError(f"process {pid} not stopped after {timeout} s: {states}")
        time.sleep(0.002)


def freeze(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        wait_stopped(pid)


def stop_at(point: str, where: str, marker: Path) -> dict:
    """The environment that makes the training process of the segment whose path holds
    `where` stop itself at `point` (before-first-batch, save:<k>; engine/self_stop.py),
    the first time only: it writes its pid into `marker` (self_stopped reads it)."""
    return {"CIFARFLOW_TEST_STOP_AT": f"{point}@{where}", "CIFARFLOW_TEST_STOPPED": str(marker)}


def self_stopped(marker: Path, proc: subprocess.Popen | None = None, timeout: float = 600) -> int:
    """The pid of the process that stopped itself (stop_at), once it is stopped; fails
    loudly if it never does (or `proc`, what started it, ends first)."""
    deadline = time.time() + timeout
    while not Path(marker).is_file():
        if proc is not None and proc.poll() is not None:
            out = proc.communicate()[0] if proc.stdout else ""
            raise AssertionError(f"no process stopped itself before its starter ended:\n"
                                 f"{(out or '')[-3000:]}")
        assert time.time() < deadline, f"no process stopped itself in {timeout} s ({marker})"
        time.sleep(0.01)
    pid = int(Path(marker).read_text())
    wait_stopped(pid)
    return pid


def train_until_saved(pids: list[int], work_dir: Path, step_s: float = 0.02,
                      timeout: float = 600) -> dict:
    """Freeze the training processes `pids` (SIGSTOP, until /proc says stopped), then let
    them go on in steps of `step_s` until their in-segment checkpoint (`work_dir`) exists;
    they stay frozen there, before their segment ended, however fast the machine trains.
    Returns the checkpoint's manifest (its "epoch" and "step" are where a resume goes on).
    Where a test can choose, a process that stops itself (stop_at) needs no steps at all."""
    from cifarflow.engine.checkpoints import files as ckpt

    freeze(pids)
    deadline = time.time() + timeout
    while not (Path(work_dir) / "checkpoint.json").exists() and time.time() < deadline:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        time.sleep(step_s)
        freeze(pids)
    assert (Path(work_dir) / "checkpoint.json").exists(), f"no in-segment checkpoint in {work_dir}"
    return ckpt.read_manifest(work_dir)


SWEEP = ("strategies: [cpu]\ndata: {{source: synthetic, synthetic: {{train_size: 1000, "
         "test_size: 200}}}}\ntrain: {{epochs: 2, batch_size: 100, log_interval_s: 100{train}}}\n"
         "segments: {{count: {segments}}}\n"
         "resources: {{cpus_per_task: 1, mem_mb: {mem_mb}, runtime: 10}}\n"
         "sweep: {{lr: {lrs}}}\npack: {{runs_per_job: {k}}}\n")


def sweep_config(path: Path, runs: int, runs_per_job: int, train: str = "",
                 mem_mb: int = 1000, segments: int = 2) -> Path:
    """A sweep of tiny cpu runs (2 epochs in 2 segments), in packs of runs_per_job; `train`:
    more train keys (YAML), e.g. "checkpoint_interval_s: 0.001"."""
    path.write_text(SWEEP.format(lrs=[round(0.01 * (i + 1), 4) for i in range(runs)],
                                 k=runs_per_job, train=f", {train}" if train else "",
                                 mem_mb=mem_mb, segments=segments))
    return path


def assert_equal_to_unpacked(workdir: Path, unpacked_sweep: dict) -> None:
    """Every run's final weights are the unpacked sweep's: bit for bit, and by the
    weights_sha256 summary.csv shows."""
    from cifarflow.engine.checkpoints.digest import weights_sha256

    rows = summary_rows(workdir)
    for run, state in final_states(workdir).items():
        assert_bit_identical(state["model"], unpacked_sweep[run]["model"])
        assert rows[run]["weights_sha256"] == weights_sha256(unpacked_sweep[run]["model"]), run


@pytest.fixture(scope="session")
def unpacked_sweep(tmp_path_factory) -> dict:
    """The 16-run sweep unpacked, trained locally: what every packed run must equal."""
    work = tmp_path_factory.mktemp("unpacked")
    snakemake(work, "--cores", "2", configfile=sweep_config(work / "c.yaml", 16, 1))
    return final_states(work)
