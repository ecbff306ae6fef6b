#!/usr/bin/env bash
# SGLang's router (PyPI `sglang-router`, a Rust binary in a wheel) in its own venv,
# .venv-sglang-router, for tests/scaleout (`make test-scaleout`). Idempotent (a stamp records
# what is installed; the venv is cached outside the clone: scripts/venv_steps.sh).
#
#     scripts/setup_sglang_router.sh            # PYTHON=python3.11 scripts/setup_sglang_router.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-sglang-router
SPEC='sglang-router==0.3.2'
STAMP=$VENV/.sglang-router-installed
TAG=setup_sglang_router
# shellcheck source=scripts/venv_steps.sh
source scripts/venv_steps.sh
ensure_venv

if ! installed "$STAMP" "$SPEC"; then
    step install "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$SPEC"
    echo "$SPEC" > "$STAMP"
fi

step import "$VENV/bin/python" -c \
    'import sglang_router, sglang_router.launch_router; print("[setup_sglang_router] sglang-router imports")'
total
