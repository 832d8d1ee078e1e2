#!/usr/bin/env bash
# A job's Python environment in node-local storage, the Alliance way (virtualenv
# --no-download, pip install --no-index). Run once on every node of the job (the prologue
# starts it with srun, one task per node): each node gets its own copy at the same path.
#
#   node_venv.sh REQUIREMENTS [pip install options...]    (the venv path is $JOB_VENV)
set -euo pipefail
req=$1; shift
venv=${JOB_VENV:?JOB_VENV is not set}
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
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" -r "$req"
echo "[env] $(hostname): $venv ready in $(( SECONDS - t0 )) s"
