#!/usr/bin/env bash
# make test: the Slurm tests and the rest of the suite at the same time, in two pytest runs.
# The Slurm tests share one cluster (one kills a node, one the controller, some preempt or
# fill the partitions), so they run one after another; they mostly wait on Slurm's timers,
# which leaves the CPUs to tests/unit and tests/integration beside them. The Slurm half's
# output goes to a log, printed whole when both halves are done; the exit status fails if
# either half fails. tests/gpu runs after tests/unit and tests/integration where CUDA is
# available (a skip there fails the suite); elsewhere one line says it was not run.
# Arguments go to both pytest runs: make test passes -m "not variant" (CI's selection),
# make test-all nothing.
#
#   tests/suite.sh [pytest options...]
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
log=$(mktemp -t cifarflow-slurm-tests.XXXXXX.log)

# job control on for the background half: without it bash starts it with SIGINT ignored,
# and the Snakemake runs the Ctrl-C tests interrupt would inherit that and go on; its stdin
# is /dev/null, as bash gives a background job without job control
set -m
"$PYTHON" -m pytest -v --durations=30 "$@" tests/slurm </dev/null >"$log" 2>&1 &
slurm_pid=$!
set +m
trap 'kill -INT $slurm_pid 2>/dev/null; wait $slurm_pid' INT TERM
echo "tests/slurm runs beside this half of the suite: tail -f $log"

"$PYTHON" -m pytest -v --durations=30 "$@" tests/unit tests/integration
rest=$?

# tests/gpu where there is a GPU, and then a skip (a missing tool or package) fails it
if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    CIFARFLOW_GPU_SKIP_FAILS=1 "$PYTHON" -m pytest -v -rs -m gpu tests/gpu
    gpu=$?
    [ "$gpu" -eq 0 ] || rest=1
else
    gpu="not run"
    echo "tests/gpu: not run (no CUDA GPU here: torch.cuda.is_available() is False)"
fi
wait $slurm_pid
slurm=$?

echo
echo "==================== tests/slurm (ran beside the above; $log) ===================="
cat "$log"
echo
echo "tests/unit + tests/integration (+ tests/gpu: $gpu): exit $rest; tests/slurm: exit $slurm"
[ "$rest" -eq 0 ] && [ "$slurm" -eq 0 ]
