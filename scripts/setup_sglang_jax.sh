#!/usr/bin/env bash
# A real SGLang-protocol server on CPU: SGLang-JAX (PyPI `sglang-jax`, import `sgl_jax`) in its
# own venv, .venv-sglang-jax, for tests/sglang and bench/bench_sglang.py. Idempotent; PyPI only.
#
#     scripts/setup_sglang_jax.sh            # PYTHON=python3.11 scripts/setup_sglang_jax.sh
#
# sglang-jax 0.1.0rc0 declares Python >= 3.12 but runs on 3.11 after two source patches
# (scripts/patch_sglang_jax.py). Everything is installed from wheels (pip would otherwise
# build scipy and friends from source) except msgpack-python, which only ships an sdist.
# Serve with (the idle scheduler keeps about one core busy: stop it when done):
#     JAX_PLATFORMS=cpu .venv-sglang-jax/bin/python -m sgl_jax.launch_server --model-path DIR \
#         --host 127.0.0.1 --port PORT --device cpu --attention-backend native --dtype float32 \
#         --disable-precompile --disable-overlap-schedule \
#         --max-running-requests 4 --context-length 1024 --chunked-prefill-size 512 \
#         --max-prefill-tokens 512 --max-total-tokens 8192
# The last line is not optional: with its defaults (4096 requests, the model's context) the
# native backend's first prefill asks for terabytes (tests/sglang/server.py: sizing_flags).
# DIR must be readable by transformers 4.57 (tests/sglang/server.py: served_folder).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-sglang-jax
SPEC='sglang-jax[cpu]==0.1.0rc0'
STAMP=$VENV/.sglang-jax-installed
start=$(date +%s%N)

since() {  # seconds since a `date +%s%N` stamp, one decimal
    local ds=$(( ($(date +%s%N) - $1) / 100000000 ))
    echo "$((ds / 10)).$((ds % 10))"
}

step() {  # step LABEL COMMAND...: run it and print how long it took
    local label=$1 t0; shift
    t0=$(date +%s%N)
    "$@"
    printf '[setup_sglang_jax] %-8s %6s s\n' "$label" "$(since "$t0")"
}

if [ ! -x "$VENV/bin/python" ]; then
    step venv "$PYTHON" -m venv "$VENV"
fi
echo '*' > "$VENV/.gitignore"  # keep the venv out of `git status` (as Python >= 3.13 venvs do)

if [ "$(cat "$STAMP" 2>/dev/null)" != "$SPEC" ]; then
    step install "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        --ignore-requires-python --only-binary=:all: --no-binary=msgpack-python "$SPEC"
    echo "$SPEC" > "$STAMP"
else
    echo "[setup_sglang_jax] install  skipped ($SPEC already installed in $VENV)"
fi

step patch "$VENV/bin/python" scripts/patch_sglang_jax.py
step import env JAX_PLATFORMS=cpu "$VENV/bin/python" -c \
    'import jax, sgl_jax, sgl_jax.launch_server; print("[setup_sglang_jax] jax", jax.__version__, jax.devices())'
printf '[setup_sglang_jax] total    %6s s\n' "$(since "$start")"
