#!/usr/bin/env bash
# Set up vLLM's CPU build in its own virtual environment: .engines/vllm-venv (git-ignored).
#
# Idempotent and cached: a stamp file records the pinned version; when it matches and the
# import check passes, nothing is done. Delete .engines/vllm-venv to rebuild from scratch.
#
# Workarounds (found setting vLLM 0.32 CPU up from PyPI on this project's CI machine):
#   1. torchvision/torchaudio/torchcodec from PyPI do not match the CPU torch and break the import
#      (operator torchvision::nms does not exist): uninstall them.
#   2. start vLLM as `python -m vllm.entrypoints.openai.api_server` (fairlib/calibrate/lifecycle.py does).
#   3. VLLM_CPU_OMP_THREADS_BIND must be a CPU list (fairlib/calibrate/lifecycle.py sets 0-1).
#
# Env: PYTHON3 (default python3), FAIRLIB_ENGINES_DIR (default <repo>/.engines; fairlib.calibrate.lifecycle reads it too), VLLM_CPU_VERSION.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINES_DIR="${FAIRLIB_ENGINES_DIR:-$ROOT/.engines}"
VENV="$ENGINES_DIR/vllm-venv"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PYTHON3="${PYTHON3:-python3}"
STAMP="$VENV/.fairlib-stamp"
WANT="vllm-cpu==$VERSION"

check() {
    # Import check with the same environment the server gets (offline; project-local caches).
    HF_HUB_OFFLINE=1 VLLM_CACHE_ROOT="$ROOT/.cache/vllm" VLLM_CPU_OMP_THREADS_BIND=0-1 \
        "$VENV/bin/python" - 2> >(grep -v "Triton is installed" >&2) <<'PY'
import importlib.metadata as md
import torch, transformers, tokenizers  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401  (the module fairlib starts)
print(f"vllm-cpu {md.version('vllm-cpu')}  torch {torch.__version__}  "
      f"transformers {transformers.__version__}  tokenizers {tokenizers.__version__}")
PY
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/python" ]]; then
    if check >/dev/null 2>&1; then
        echo "setup_vllm: cached ($WANT in $VENV)"
        exit 0
    fi
    echo "setup_vllm: stamp present but the import check failed; reinstalling"
fi

t0=$SECONDS
mkdir -p "$ENGINES_DIR"
rm -f "$STAMP"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON3" -m venv "$VENV"
fi
# (the grep drops pip's warnings about this machine's absent local index folders)
"$VENV/bin/python" -m pip install --disable-pip-version-check -q "$WANT" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
t1=$SECONDS
# Workaround 1 (quiet when not installed).
"$VENV/bin/python" -m pip uninstall --disable-pip-version-check -q -y torchvision torchaudio torchcodec \
    >/dev/null 2>&1 || true
check
echo "$WANT" > "$STAMP"
echo "setup_vllm: installed $WANT in $((t1 - t0)) s, total $((SECONDS - t0)) s; $(du -sh "$VENV" | cut -f1) in $VENV"
