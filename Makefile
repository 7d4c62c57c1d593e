# `make run`: set up .venv and run the main job.  `make test`: set up .venv and run the test suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m sim run configs/switch_xxl.yaml

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_stats.py
	$(PY) benchmarks/bench_sim.py
	$(PY) benchmarks/bench_sweep.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
