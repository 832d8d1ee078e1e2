"""A job's software prologue, per env.mode (the shell the training command runs after)."""

import os
import subprocess
import sys
from pathlib import Path

from cifarflow.job.job_env import prologue

ENV = {"mode": "current", "modules": [], "venv": "", "requirements": "",
       "pip_no_index": True, "find_links": "", "pythonpath": []}
REQ = Path("/work/results/environment/job-requirements.txt")
ENGINE = "export PYTHONPATH=/wf/scripts && "  # the engine's folder alone: no login-shell entries


def test_current_resets_pythonpath_and_venv_activates_its_venv():
    assert prologue(ENV, Path("/wf"), REQ) == ENGINE
    assert prologue({**ENV, "mode": "venv", "venv": "/my env"}, Path("/wf"), REQ) == \
        ENGINE + "source '/my env'/bin/activate && "
    assert prologue({**ENV, "pythonpath": ["/my models", "/x"]}, Path("/wf"), REQ) == \
        "export PYTHONPATH='/wf/scripts:/my models:/x' && "


def test_slurm_tmpdir_purges_loads_modules_then_builds_on_every_node():
    env = {**ENV, "mode": "slurm_tmpdir", "modules": ["python/3.11", "arrow"], "find_links": "/w"}
    one = prologue(env, Path("/wf"), REQ)
    # Lmod's `module` is a shell function: purged only where it exists, then env.modules
    assert one.startswith("if type module >/dev/null 2>&1; then module purge; fi && "
                          "module load python/3.11 arrow && " + ENGINE + "export JOB_VENV=")
    assert "build_start=$SECONDS && /wf/workflow/scripts/node_venv.sh " \
           "/work/results/environment/job-requirements.txt --no-index --find-links /w && " \
           "export CIFARFLOW_ENV_BUILD_S=$((SECONDS - build_start)) && " \
           "source \"$JOB_VENV/bin/activate\" && " in one
    assert "--no-index" not in prologue({**env, "pip_no_index": False}, Path("/wf"), REQ)
    # no modules named: the login shell's stay (a venv made on a python module needs it)
    assert "module" not in prologue({**env, "modules": []}, Path("/wf"), REQ)


def test_the_venv_is_built_once_on_every_node_the_job_holds(tmp_path):
    """node_venv.sh in a job of several nodes (the count the workflow kept past the jobstep)
    starts itself again once per node through srun; inside that step, or on one node, it
    builds in place. srun is stood in for here by a script that records its arguments; the
    Slurm tests run the real one (ddp over two nodes, a pack spread over two nodes)."""
    script = Path(__file__).resolve().parents[2] / "workflow/scripts/node_venv.sh"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/srun-args\n")
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "JOB_VENV": str(tmp_path / "env"),
           "CIFARFLOW_SLURM_JOB_NUM_NODES": "2"}
    subprocess.run(["bash", str(script), "/req.txt", "--no-index"], env=env, check=True)
    assert (tmp_path / "srun-args").read_text().split() == [
        "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--cpus-per-task=1", str(script), "/req.txt", "--no-index"]
    assert not (tmp_path / "env").exists()  # the steps build, not the job's own shell
    (tmp_path / "srun-args").unlink()
    inside = subprocess.run(["bash", str(script), "/nonexistent.txt"], capture_output=True,
                            text=True, env={**env, "SLURM_STEP_ID": "0",
                                            "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"})
    assert not (tmp_path / "srun-args").exists()  # in the step: builds here
    assert (tmp_path / "env/bin/python").exists() and "nonexistent.txt" in inside.stderr
