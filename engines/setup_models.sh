#!/usr/bin/env bash
# Make the tiny random-weight test models in .engines/models (git-ignored), with a small tools
# environment (.engines/tools-venv: numpy, safetensors, tokenizers, gguf; no torch).
# Cached: the tools venv by a stamp of its pins, the models by engines/make_models.py itself.
# Extra arguments go to make_models.py (e.g. --force, --seed 1).
#
# Env: PYTHON3 (default python3), FAIRLIB_ENGINES_DIR (default <repo>/.engines; fairlib.calibrate.lifecycle reads it too).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINES_DIR="${FAIRLIB_ENGINES_DIR:-$ROOT/.engines}"
VENV="$ENGINES_DIR/tools-venv"
PYTHON3="${PYTHON3:-python3}"
PINS=(gguf==0.19.0 numpy==2.3.5 safetensors==0.8.0 tokenizers==0.23.3)
STAMP="$VENV/.fairlib-stamp"

t0=$SECONDS
if [[ ! -x "$VENV/bin/python" || ! -f "$STAMP" || "$(cat "$STAMP")" != "${PINS[*]}" ]]; then
    rm -rf "$VENV"
    mkdir -p "$ENGINES_DIR"
    "$PYTHON3" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q "${PINS[@]}" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    echo "${PINS[*]}" > "$STAMP"
    echo "setup_models: tools venv in $((SECONDS - t0)) s"
fi
"$VENV/bin/python" "$ROOT/engines/make_models.py" --out "$ENGINES_DIR/models" "$@"
echo "setup_models: done in $((SECONDS - t0)) s"
