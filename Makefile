# Two commands set everything up: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

DEB_PACKAGES := slurmctld slurmd slurm-client slurmdbd slurm-wlm-basic-plugins munge mariadb-server lmod e2fsprogs iproute2 chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-all test-fast lint debian-packages dry-run bench gpu-check gpu-bundle tensorboard slurm-up slurm-down clean

# requirements.txt and requirements-optional.txt at the exact versions of constraints.txt,
# then this project itself: the `cifarflow` command the rules call
$(STAMP): requirements.txt requirements-optional.txt constraints.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-optional.txt -c constraints.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $(DEV_STAMP)

run: $(STAMP)  ## train the offline demo (synthetic data, cpu), then show the results at a glance
	$(VENV)/bin/snakemake --profile profiles/local
	@echo; $(VENV)/bin/cifarflow show results

dry-run: $(STAMP)
	$(VENV)/bin/snakemake -n

debian-packages:  ## what the tests run for real: Slurm, munge, ip (the test nodes' network), headless Chromium
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:" $$missing; \
	    $(SUDO) apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing >/dev/null; \
	fi

lint: $(DEV_STAMP)  ## snakefmt, and snakemake --lint but its one accepted finding (README, "Lint")
	$(VENV)/bin/snakefmt --check Snakefile workflow/rules
	$(PY) tests/lint_workflow.py

test: lint debian-packages  ## what CI runs: the suite but its `variant` tests (starts the test Slurm cluster: this host plus two namespaced nodes; tests/gpu where CUDA is)
	bash tests/slurm/cluster.sh start
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH PYTHON=$(PY) bash tests/suite.sh -m "not variant"

test-all: lint debian-packages  ## the whole suite, the `variant` tests too (costlier variants of claims make test proves)
	bash tests/slurm/cluster.sh start
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH PYTHON=$(PY) bash tests/suite.sh

test-fast: $(DEV_STAMP)  ## the edit-test loop (< 10 min): tests/unit and tests/integration, no Slurm, no `slow`
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q --durations=15 -m "not slow and not variant" tests/unit tests/integration

bench: $(STAMP)
	$(PY) bench/bench.py

GPU_PYTHON ?= python3
GPU_BUDGET ?= 480
# any Python with pip: the venv's where there is one
BUNDLE_PYTHON ?= $(shell test -x $(PY) && echo $(PY) || echo python3)
gpu-check:  ## on a GPU machine with torch + CUDA (no venv, no snakemake, no index): the goal figures, the gpu tests, the strategies, within GPU_BUDGET s (bench/gpu_check.py; --plan: the caps)
	$(GPU_PYTHON) bench/gpu_check.py --budget $(GPU_BUDGET)

gpu-bundle:  ## where pip reaches an index: pytest & co. (pure-Python wheels) into bench/gpu_bundle, which gpu-check uses
	$(BUNDLE_PYTHON) bench/gpu_bundle.py

tensorboard: $(STAMP)  ## TensorBoard over every run's curves (results/tensorboard/<run>)
	$(VENV)/bin/tensorboard --logdir results/tensorboard

slurm-up: debian-packages
	bash tests/slurm/cluster.sh start

slurm-down:
	bash tests/slurm/cluster.sh stop

clean:
	rm -rf results .snakemake
