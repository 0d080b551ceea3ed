#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source vendored in the llama-cpp-python sdist on PyPI.
#
# Output: .engines/llama.cpp/build/bin/llama-server (git-ignored). Cached: skipped when the binary
# exists and the stamp (version + CMake flags) matches; an interrupted build resumes (the source
# and the build folder are kept, ninja/make redo only what is missing). Delete .engines/llama.cpp
# to rebuild from scratch.
#
# Flags: Release; no curl/openssl; no tests/examples; no web UI,
# and LLAMA_USE_PREBUILT_UI=OFF (it defaults to downloading the UI at build time: no network here).
#
# Env: FAIRLIB_ENGINES_DIR (default <repo>/.engines; fairlib.calibrate.lifecycle reads it too),
#      LLAMA_CPP_PYTHON_VERSION (default 0.3.36), JOBS (default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINES_DIR="${FAIRLIB_ENGINES_DIR:-$ROOT/.engines}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"
DIR="$ENGINES_DIR/llama.cpp"
BUILD="$DIR/build"
BIN="$BUILD/bin/llama-server"
STAMP="$DIR/.fairlib-stamp"
SRC="$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
)
WANT="llama-cpp-python==$VERSION ${CMAKE_FLAGS[*]}"

if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "setup_llamacpp: cached ($BIN, llama-cpp-python $VERSION)"
    exit 0
fi

for tool in cmake g++ make; do
    command -v "$tool" >/dev/null || { echo "setup_llamacpp: needs $tool (apt-get install cmake g++ make)" >&2; exit 1; }
done
GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi

t0=$SECONDS
rm -f "$STAMP"
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    rm -rf "$DIR"
    mkdir -p "$DIR/sdist"
    # --no-binary for this package only: the same sdist as `--no-binary :all:`, but the build
    # backend pip installs to read the sdist's metadata comes as wheels (":all:" builds setuptools
    # and friends from source first: ~2 min more on 2 cores). The grep drops pip's warnings about
    # this machine's absent local index folders.
    python3 -m pip download --disable-pip-version-check -q --no-binary llama-cpp-python --no-deps \
        -d "$DIR/sdist" "llama-cpp-python==$VERSION" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    (cd "$DIR/sdist" && sha256sum ./*.tar.gz) > "$DIR/sdist.sha256"
    tar -xzf "$DIR/sdist"/llama_cpp_python-"$VERSION".tar.gz -C "$DIR"
    rm -rf "$DIR/sdist"
    [[ -f "$SRC/CMakeLists.txt" ]] || { echo "setup_llamacpp: no vendored llama.cpp in the sdist" >&2; exit 1; }
fi
t1=$SECONDS
if [[ -f "$BUILD/CMakeCache.txt" ]] && ! grep -q "CMAKE_HOME_DIRECTORY:INTERNAL=$SRC\$" "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD"
fi
cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" "${CMAKE_FLAGS[@]}" >"$DIR/cmake-configure.log" 2>&1 \
    || { tail -n 40 "$DIR/cmake-configure.log" >&2; exit 1; }
cmake --build "$BUILD" --target llama-server -j "$JOBS" >"$DIR/cmake-build.log" 2>&1 \
    || { tail -n 40 "$DIR/cmake-build.log" >&2; exit 1; }
t2=$SECONDS
"$BIN" --version 2>&1 | head -n 1
echo "$WANT" > "$STAMP"
echo "setup_llamacpp: source $((t1 - t0)) s, build $((t2 - t1)) s; build folder $(du -sh "$BUILD" | cut -f1)"
