# fnsysid: `make run` and `make test` set everything up on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install run test test-slow lint bench clean

help:  ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install fnsysid with its pinned dependencies

run: $(STAMP)  ## run the default experiment (pendulum, M=20); results in outputs/runs/
	$(PY) run.py $(ARGS)

test: $(STAMP)  ## fast test suite
	$(PY) -m pytest -q

test-slow: $(STAMP)  ## the slow tests too
	$(PY) -m pytest -q -m "slow or not slow"

lint: $(STAMP)  ## ruff
	$(PY) -m ruff check fnsysid scripts tests run.py

bench: $(STAMP)  ## time and peak memory of the benchmark cases (docs/PERFORMANCE.md)
	$(PY) scripts/bench.py

clean:  ## remove results and caches (keeps .venv)
	rm -rf outputs multirun .pytest_cache .ruff_cache
