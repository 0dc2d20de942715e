# fnsysid: `make run` and `make test` set everything up on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install install-flower install-cluster install-docs run test test-flower test-flower-slow test-slow test-slow-core test-docs docs lint help-text bench figures clean flower-deploy fig-personalized fig-privacy wheel

help:  ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'
	@echo "  fig-<name>     one figure of scripts/figures.yaml (experiments, then figures/<name>.*):"
	@for f in $(FIGS); do echo "                   make fig-$$f"; done

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install fnsysid with its pinned dependencies

install-flower: $(STAMP)  ## add the Flower extra (runtime=flower, docs/FEDERATED.md)
	$(PY) -m pip install --quiet -e '.[dev,flower]'

install-docs: $(STAMP)  ## add the documentation extra (MkDocs, mkdocstrings, mkdocs-jupyter)
	$(PY) -m pip install --quiet -e '.[dev,docs]'

docs: install-docs  ## the documentation site in site/ (strict: a broken link fails the build)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

test-docs: docs  ## build the site, then open its pages in headless Chromium (apt: chromium)
	$(PY) -m pytest -q -m docs tests/test_docs_site.py

install-cluster: $(STAMP)  ## add the submitit launcher extra (hydra/launcher=submitit_slurm)
	$(PY) -m pip install --quiet -e '.[dev,cluster]'

run: $(STAMP)  ## run the default experiment (pendulum, M=20); results in outputs/runs/
	$(PY) run.py $(ARGS)

test: $(STAMP)  ## fast test suite, spread over the cores (pytest-xdist), without the Flower tests
	FNSYSID_TEST_FLOWER=0 $(PY) -m pytest -q -n auto --dist loadfile

test-flower: install-flower  ## the Flower tests that are not slow (adds the flower extra first)
	FNSYSID_TEST_FLOWER=1 $(PY) -m pytest -q -p no:xdist -m "flower and not slow"

test-flower-slow: install-flower  ## the slow Flower tests: deployments on loopback and in network namespaces, the deployment guide as written, node failures (needs root for ip netns)
	FNSYSID_TEST_FLOWER=1 $(PY) -m pytest -q -p no:xdist -m "flower and slow"

test-slow: $(STAMP)  ## the slow tests too
	$(PY) -m pytest -q -m "(slow or not slow) and not docs"

test-slow-core: $(STAMP)  ## only the slow tests that are not Flower or documentation tests
	FNSYSID_TEST_FLOWER=0 $(PY) -m pytest -q -n auto --dist loadfile -m "slow and not flower and not docs"

flower-deploy: $(STAMP)  ## a Flower deployment on 127.0.0.1 (SuperLink + 3 SuperNodes) vs in process; ARGS=--netns: one host each
	$(PY) scripts/flower_deploy.py $(ARGS)

wheel: $(STAMP)  ## dist/fnsysid-<version>-py3-none-any.whl, with the Flower app (docs/FEDERATED.md)
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .
	@ls dist/fnsysid-*.whl

lint: $(STAMP)  ## ruff
	$(PY) -m ruff check fnsysid scripts tests examples run.py

help-text: $(STAMP)  ## rewrite the knobs of --help (conf/hydra/help/fnsysid.yaml) from the schema's descriptions
	$(PY) scripts/settings_reference.py --write-help

bench: $(STAMP)  ## time and peak memory of the benchmark cases (docs/PERFORMANCE.md)
	$(PY) scripts/bench.py

figures: $(STAMP)  ## run every experiment and redraw every figure in figures/ (both cores, one process per core)
	$(PY) scripts/make_figure.py --all

# fig-<name> for each figure of scripts/figures.yaml, e.g. make fig-pendulum-gd
FIGS := pendulum-gd pendulum-gd-long pendulum-gd-published pendulum-sgd synthetic-gd \
        synthetic-gd-published error-vs-sqrt-m rate theorem1 error-vs-k quadrotor-gd strategies \
        sgd-vs-gd heterogeneous-k communication
.PHONY: $(addprefix fig-,$(FIGS))
$(addprefix fig-,$(FIGS)): fig-%: $(STAMP)
	$(PY) scripts/make_figure.py $(subst -,_,$*)

fig-personalized: $(STAMP)  ## personalized models and interval coverage against eps (figures/personalized.*)
	$(PY) scripts/personalized.py $(ARGS)

fig-privacy: $(STAMP)  ## final error against the privacy budget epsilon, M = 1e3 to 1e6 (figures/privacy.*)
	$(PY) scripts/privacy_figure.py $(ARGS)

figures-list:  ## only the fig-<name> targets
	@for f in $(FIGS); do echo "  make fig-$$f"; done

clean:  ## remove results and caches (keeps .venv)
	rm -rf outputs multirun .pytest_cache .ruff_cache dist build site
