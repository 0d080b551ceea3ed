# fairlib: build the book and run the tests from a fresh clone.
#   make book       execute every chapter on the simulator and build the HTML book (_build/html)
#   make test       unit/property/integration tests, then nbval over the chapter notebooks
#   make test-fast  unit tests only (no slow, no real-engine tests)
#   make bench      run benchmarks/*.py
#   make clean      remove build outputs and caches (keeps .venv); make distclean also drops .venv

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.stamp

# Project-local caches (git-ignored), exported to every recipe and every kernel they start.
export NUMBA_CACHE_DIR := $(CURDIR)/.cache/numba
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export JUPYTER_PLATFORM_DIRS := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1
export MPLBACKEND := Agg

VEGA_OUT    := book/_static/generated
VEGA_STAMP  := $(VEGA_OUT)/.stamp
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

.PHONY: help venv book vega test test-fast nbval bench clean distclean

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	$(PY) -m pip install --disable-pip-version-check -q -e . --no-deps
	mkdir -p $(NUMBA_CACHE_DIR)
	touch $@

# Offline vega/vega-lite/vega-embed for altair's HTML renderer (no CDN in the built book).
$(VEGA_STAMP): book/_scripts/make_vega_bundle.py $(STAMP)
	$(PY) book/_scripts/make_vega_bundle.py $(VEGA_OUT)
	touch $@

vega: $(VEGA_STAMP)

# _config.yml: execute_notebooks: force, raise_on_error: true -> every chapter runs on its
# default parameters (the simulator backend) and any cell error fails the build.
book: $(STAMP) $(VEGA_STAMP)
	$(VENV)/bin/jupyter-book build . --all -W -n --keep-going
	@echo "book: $(CURDIR)/_build/html/index.html"

test: $(STAMP)
	$(PY) -m pytest tests -q
	$(PY) -m pytest $(NBVAL_FLAGS) notebooks/ -q

nbval: $(STAMP)
	$(PY) -m pytest $(NBVAL_FLAGS) notebooks/ -q

test-fast: $(STAMP)
	$(PY) -m pytest tests -q -m "not slow and not engine"

bench: $(STAMP)
	@shopt -s nullglob; files=(benchmarks/*.py); \
	if [ $${#files[@]} -eq 0 ]; then echo "no benchmarks/*.py"; exit 0; fi; \
	for f in "$${files[@]}"; do echo "== $$f"; $(PY) "$$f"; done

clean:
	rm -rf _build $(VEGA_OUT) .cache .pytest_cache .hypothesis .benchmarks *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
