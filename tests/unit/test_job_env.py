"""A job's software prologue, per env.mode (the shell the training command runs after)."""

from pathlib import Path

from cifarflow.job_env import prologue

ENV = {"mode": "current", "modules": [], "venv": "", "requirements": "",
       "pip_no_index": True, "find_links": ""}
REQ = Path("/work/results/environment/job-requirements.txt")


def test_current_needs_nothing_and_venv_activates_its_venv():
    assert prologue(ENV, Path("/wf"), REQ) == ""
    assert prologue({**ENV, "mode": "venv", "venv": "/my env"}, Path("/wf"), REQ) == \
        "source '/my env'/bin/activate && "


def test_slurm_tmpdir_loads_modules_then_builds_on_every_node():
    env = {**ENV, "mode": "slurm_tmpdir", "modules": ["python/3.11", "arrow"], "find_links": "/w"}
    one = prologue(env, Path("/wf"), REQ)
    assert one.startswith("module load python/3.11 arrow && export JOB_VENV=")
    assert "build_start=$SECONDS && /wf/workflow/scripts/node_venv.sh " \
           "/work/results/environment/job-requirements.txt --no-index --find-links /w && " \
           "export CIFARFLOW_ENV_BUILD_S=$((SECONDS - build_start)) && " \
           "source \"$JOB_VENV/bin/activate\" && " in one
    two = prologue(env, Path("/wf"), REQ, nodes=2)
    assert "srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 " \
           "--cpus-per-task=1 /wf/workflow/scripts/node_venv.sh" in two
    assert "--no-index" not in prologue({**env, "pip_no_index": False}, Path("/wf"), REQ)
