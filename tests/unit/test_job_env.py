"""A job's software prologue, per env.mode (the shell the training command runs after)."""

from pathlib import Path

from cifarflow.job_env import prologue

ENV = {"mode": "current", "modules": [], "venv": "", "requirements": "requirements-train.txt",
       "pip_no_index": True, "find_links": ""}


def test_current_needs_nothing_and_venv_activates_its_venv():
    assert prologue(ENV, Path("/wf")) == ""
    assert prologue({**ENV, "mode": "venv", "venv": "/my env"}, Path("/wf")) == \
        "source '/my env'/bin/activate && "


def test_slurm_tmpdir_loads_modules_then_builds_on_every_node():
    env = {**ENV, "mode": "slurm_tmpdir", "modules": ["python/3.11", "arrow"], "find_links": "/w"}
    one = prologue(env, Path("/wf"))
    assert one.startswith("module load python/3.11 arrow && export JOB_VENV=")
    assert "/wf/workflow/scripts/node_venv.sh /wf/requirements-train.txt --no-index " \
           "--find-links /w && source \"$JOB_VENV/bin/activate\" && " in one
    two = prologue(env, Path("/wf"), nodes=2)
    assert "srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 " \
           "--cpus-per-task=1 /wf/workflow/scripts/node_venv.sh" in two
    assert "--no-index" not in prologue({**env, "pip_no_index": False}, Path("/wf"))
