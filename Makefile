# `make run`: set up .venv and run the main job.  `make test`: set up .venv, run `make lint`, then the test suite.
# `make lint`: ruff (lint rules and format check) over the tree and mypy over moebase/, sim/, traces/ and validate/
# (pyproject.toml's [tool.ruff] and [tool.mypy]).  `make format`: rewrite the tree in ruff's format and import order.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LINT_STAMP := $(VENV)/.lint-installed
# The linters, pinned: another version may flag (or format) differently.
LINT_TOOLS := ruff==0.17.6 mypy==2.4.1

.PHONY: run test lint format bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m sim run configs/switch_xxl.yaml

# the lint runs first: CI (.ci/run) runs exactly this target, so a finding fails CI as a failing test does.
# Two pytest-xdist workers (CI has 2 cores), each test file on one worker (its module fixtures built once). Tests
# in different files may meet: each uses its own temporary folders, and the Ray ones their own instances (the sweep
# starts its local one with address="local", never joining the test cluster). A plain `pytest` runs in one process.
test: lint
	$(PY) -m pytest -q -n 2 --dist loadfile

$(LINT_STAMP): $(STAMP) Makefile
	$(PY) -m pip install -q $(LINT_TOOLS)
	touch $(LINT_STAMP)

# all three run, so one report shows every finding; the status is 1 if any of them found something
lint: $(LINT_STAMP)
	status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/ruff format --check --output-format concise . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	exit $$status

format: $(LINT_STAMP)
	$(VENV)/bin/ruff check --fix --select I .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) benchmarks/bench_stats.py
	$(PY) benchmarks/bench_sim.py
	$(PY) benchmarks/bench_sweep.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
