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
VENV_KEY=$(sha256sum scripts/patch_sglang_jax.py)  # a changed patch gets a fresh venv
TAG=setup_sglang_jax
# shellcheck source=scripts/venv_steps.sh
source scripts/venv_steps.sh
ensure_venv

if ! installed "$STAMP" "$SPEC"; then
    step install "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        --ignore-requires-python --only-binary=:all: --no-binary=msgpack-python "$SPEC"
    echo "$SPEC" > "$STAMP"
fi

step patch "$VENV/bin/python" scripts/patch_sglang_jax.py
step import env JAX_PLATFORMS=cpu "$VENV/bin/python" -c \
    'import jax, sgl_jax, sgl_jax.launch_server; print("[setup_sglang_jax] jax", jax.__version__, jax.devices())'
total
