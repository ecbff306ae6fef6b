#!/usr/bin/env bash
# The llama.cpp engine's binding, llama-cpp-python, installed into the server's own venv
# (the engine runs in-process): `make test-llamacpp` runs it; PyPI only, hashes pinned.
#
#     scripts/setup_llamacpp.sh                      # into .venv (PY=other/python to choose)
#     LLAMACPP_TARGET=dir scripts/setup_llamacpp.sh  # into a plain folder, for PYTHONPATH
#     scripts/setup_llamacpp.sh wheel                # only the cached wheel (built when absent)
#
# llama-cpp-python ships an sdist only: it is built once into a wheel (a few minutes on 2
# cores) kept in $OPENJEV_WHEEL_CACHE (default ~/.cache/openjev/wheels), outside the clone,
# under a name keyed by the sdist's hash, the Python version and this CPU's flags (the build
# uses the CPU's own instructions: AVX-512 here). Later runs, from any clone, install that
# wheel in seconds. Binaries are refused for llama-cpp-python alone (its sdist, hash-pinned):
# its build dependencies (scikit-build-core) come as wheels, not built from source too. Why
# this binding and not the prebuilt ik-llama-cpp-python: docs/engines.md.
# Only what the engine loads is built: the multimodal library (mtmd/llava) and llama.cpp's
# `common` library are left out.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=setup_llamacpp
PY=${PY:-.venv/bin/python}
VERSION=0.3.36
SDIST_SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# llama_cpp's package __init__ imports diskcache (its high-level cache, unused here); numpy,
# jinja2 and typing-extensions, its other dependencies, are in requirements.lock.
DISKCACHE='diskcache==5.6.3 --hash=sha256:5e31b2d5fbad117cc363ebaf6b689474db18a1f6438bc82358b024abd4c2ca19'
# shellcheck source=scripts/venv_steps.sh
source scripts/venv_steps.sh

# llama-cpp-python forces llama.cpp's `common` library on (CACHE FORCE) for the multimodal
# library; neither is loaded by the binding, and `common` is 57 of the 140 build steps (its
# slowest): a file included at the end of llama.cpp's own project() turns it off again.
NO_COMMON='set(LLAMA_BUILD_COMMON OFF CACHE BOOL "not loaded by the binding" FORCE)'
BUILD_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=<$NO_COMMON>"
CACHE=${OPENJEV_WHEEL_CACHE:-$HOME/.cache/openjev/wheels}
KEY=$( { echo "$SDIST_SHA $BUILD_ARGS"; "$PY" -c 'import sys; print(sys.version)'; grep -m1 '^flags' /proc/cpuinfo || true; } | sha256sum | cut -c1-12)
DIR=$CACHE/llama-cpp-python-$VERSION-$KEY
mkdir -p "$CACHE"
exec 9>"$DIR.lock"  # one builder at a time per key (two CI runs at once)
flock 9

if ! ls "$DIR"/llama_cpp_python-"$VERSION"-*.whl >/dev/null 2>&1; then
    tmp=$(mktemp -d)
    echo "llama-cpp-python==$VERSION --hash=sha256:$SDIST_SHA" > "$tmp/req.txt"
    step download "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
        --require-hashes -r "$tmp/req.txt" -d "$tmp/sdist"
    echo "$NO_COMMON" > "$tmp/no_common.cmake"
    cmake_args="-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$tmp/no_common.cmake"
    # CMAKE_BUILD_PARALLEL_LEVEL: every core (the default build runs one compiler at a time)
    echo "[$TAG] building llama-cpp-python $VERSION from source (a few minutes on 2 cores, once per machine)"
    # pip -v for the build's own "[n/m]" or "[ nn%]" lines, shown as a line per tenth done; the
    # whole output is kept and shown only if the build fails.
    if ! step build bash -c 'env CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" CMAKE_ARGS="$1" "$2" -m pip wheel -v \
            --disable-pip-version-check --no-deps "$3" -w "$4" 2>&1 | tee "$5" | "$2" scripts/build_progress.py "$6"' \
            _ "$cmake_args" "$PY" "$tmp/sdist/llama_cpp_python-$VERSION.tar.gz" "$tmp/wheel" "$tmp/build.log" "$TAG"; then
        tail -40 "$tmp/build.log" >&2
        echo "[$TAG] the build failed; its last lines are above (whole log: $tmp/build.log)" >&2
        exit 1
    fi
    mkdir -p "$DIR"
    mv "$tmp"/wheel/*.whl "$DIR/"
    rm -rf "$tmp"
fi
WHEEL=$(ls "$DIR"/llama_cpp_python-"$VERSION"-*.whl)
if [ "${1:-}" = wheel ]; then
    echo "[$TAG] wheel    $WHEEL"
    total
    exit 0
fi

if [ -n "${LLAMACPP_TARGET:-}" ]; then
    STAMP=$LLAMACPP_TARGET/.llamacpp-installed
    if ! installed "$STAMP" "$WHEEL"; then
        tmp=$(mktemp)
        echo "$DISKCACHE" > "$tmp"
        rm -rf "$LLAMACPP_TARGET"
        step install "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$LLAMACPP_TARGET" \
            "$WHEEL"
        step deps "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
            --target "$LLAMACPP_TARGET/.deps" -r "$tmp"
        mv "$LLAMACPP_TARGET"/.deps/* "$LLAMACPP_TARGET"/ && rmdir "$LLAMACPP_TARGET/.deps"
        rm -f "$tmp"
        echo "$WHEEL" > "$STAMP"
    fi
    export PYTHONPATH="$LLAMACPP_TARGET${PYTHONPATH:+:$PYTHONPATH}"
else
    STAMP=$(dirname "$(dirname "$PY")")/.llamacpp-installed
    if ! installed "$STAMP" "$WHEEL"; then
        tmp=$(mktemp)
        echo "$DISKCACHE" > "$tmp"
        step deps "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r "$tmp"
        step install "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$WHEEL"
        rm -f "$tmp"
        echo "$WHEEL" > "$STAMP"
    fi
fi

step import "$PY" -c 'import llama_cpp; print("[setup_llamacpp] llama-cpp-python", llama_cpp.__version__)'
total
