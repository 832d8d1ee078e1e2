#!/usr/bin/env bash
# A job's Python environment in node-local storage, the Alliance way (virtualenv
# --no-download, pip install --no-index), on every node of the job: a job on several nodes
# (ddp over nodes, a pack whose members Slurm spread) runs this script again once per node
# through srun, so each node gets its own copy at the same path.
#
#   node_venv.sh REQUIREMENTS [pip install options...]    (the venv path is $JOB_VENV)
set -euo pipefail
req=$1; shift
venv=${JOB_VENV:?JOB_VENV is not set}
nodes=${CIFARFLOW_SLURM_JOB_NUM_NODES:-1}  # kept by the workflow: the jobstep drops SLURM_*
if (( nodes > 1 )) && [[ -z ${SLURM_STEP_ID:-} ]]; then
    exec srun --kill-on-bad-exit=1 --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 \
        --cpus-per-task=1 "$0" "$req" "$@"
fi
t0=$SECONDS
if [[ -x $venv/bin/python ]]; then
    echo "[env] $(hostname): reusing $venv"
else
    if command -v virtualenv >/dev/null; then
        virtualenv -q --no-download "$venv"
    else
        python -m venv "$venv"
    fi
fi
# --no-compile: the venv lives for one job, whose ranks import a small part of what is
# installed; byte-compiling all of torch at install costs more (measured on 2 cores: torch
# alone installs in 7.7 s instead of 22 s; its first import takes 4 s longer)
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile "$@" -r "$req"
echo "[env] $(hostname): $venv ready in $(( SECONDS - t0 )) s"
