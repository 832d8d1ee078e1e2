# Two commands set everything up: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast dry-run bench slurm-up slurm-down clean

$(STAMP): requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $(STAMP)

run: $(STAMP)  ## train the offline demo (synthetic data, cpu) and summarise it
	$(VENV)/bin/snakemake --profile profiles/local
	@echo; cat results/summary.csv; echo; cat results/advice.md

dry-run: $(STAMP)
	$(VENV)/bin/snakemake -n

test: $(STAMP)  ## the whole suite (starts a one-node Slurm cluster for the slurm tests)
	bash tests/slurm/cluster.sh start
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -v tests

test-fast: $(STAMP)  ## without the real-Slurm tests
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -v -m "not slurm" tests

bench: $(STAMP)
	$(PY) bench/bench.py

slurm-up:
	bash tests/slurm/cluster.sh start

slurm-down:
	bash tests/slurm/cluster.sh stop

clean:
	rm -rf results .snakemake
