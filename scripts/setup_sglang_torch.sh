#!/usr/bin/env bash
# The real SGLang (PyTorch, PyPI `sglang`) on CPU in its own venv, .venv-sglang-torch, for
# tests/sglang (`make test-sglang-torch`) and bench/bench_sglang_own.py. Idempotent (a stamp
# records what is installed); PyPI and the machine's local CPU torch wheel only.
#
#     scripts/setup_sglang_torch.sh            # PYTHON=python3.11 scripts/setup_sglang_torch.sh
#
# sglang 0.5.23's metadata pins torch 2.14.1 and CUDA-only packages (flashinfer, cuda-python,
# cutlass, deep-gemm, ...), none of them used on CPU. So: the CPU torch 2.13.0 wheel first,
# then sglang with --no-deps and the runtime dependencies its CPU imports need, listed below
# (found by importing the server, scheduler, model runner and llama model). Then the two CPU
# TEST SHIMS of tests/sglang_torch/shims (never shipped in the package; see their docstrings):
# a stub `sgl_kernel` (PyPI has no CPU sgl-kernel) and a .pth that lets the CUDA-linked
# torchvision wheel import next to the CPU torch.
# Serve with (the idle scheduler keeps about one core busy: stop it when done):
#     SGLANG_USE_CPU_ENGINE=1 .venv-sglang-torch/bin/python -m sglang.launch_server \
#         --model-path DIR --host 127.0.0.1 --port PORT --device cpu \
#         --attention-backend torch_native --disable-cuda-graph --skip-server-warmup \
#         --dtype float32 --max-running-requests 8 --context-length 2048 \
#         --chunked-prefill-size 1024 --max-total-tokens 32768
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-sglang-torch
TORCH='torch==2.13.0'
SGLANG='sglang==0.5.23'
# sglang's runtime dependencies on CPU, versions as its metadata pins them where it does.
DEPS=(
    aiohttp fastapi 'uvicorn>=0.51' uvloop orjson pydantic python-multipart 'pyzmq>=25.1.2'
    requests numpy packaging psutil pybase64 setproctitle 'prometheus-client>=0.20.0' msgspec
    xxhash zstandard regex tqdm 'python-dateutil<3' pillow dill jsonschema IPython
    'transformers==5.19.0' 'tokenizers==0.23.2' 'sentencepiece==0.2.1' tiktoken einops
    interegular partial_json_parser 'openai==2.8.0' 'openai-harmony==0.0.4'
    'llguidance>=1.7.6,<2' 'xgrammar==0.2.7' 'compressed-tensors==0.18.0' gguf
    'blobfile==3.0.0' distro 'soundfile>=0.13.1'
)
TORCHVISION='torchvision==0.28.0'  # no deps: it would pull a CUDA torch
SHIMS=tests/sglang_torch/shims
SPEC="$TORCH $SGLANG ${DEPS[*]} $TORCHVISION"
STAMP=$VENV/.sglang-torch-installed
TAG=setup_sglang_torch
# shellcheck source=scripts/venv_steps.sh
source scripts/venv_steps.sh
ensure_venv
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)

if ! installed "$STAMP" "$SPEC"; then
    # torch by pip, pinned: the machine's local CPU wheel (an unpinned torch pulls a CUDA one)
    step torch "${PIP[@]}" "$TORCH"
    step sglang "${PIP[@]}" --no-deps "$SGLANG"
    # "$TORCH" again: the resolver keeps the CPU wheel instead of upgrading it for a dependency
    step deps "${PIP[@]}" --only-binary=:all: "$TORCH" "${DEPS[@]}"
    step vision "${PIP[@]}" --no-deps --only-binary=:all: "$TORCHVISION"
    echo "$SPEC" > "$STAMP"
fi

# The shims are copied every time (cheap), so that an edit to them reaches the venv.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$SITE/sgl_kernel"
cp -r "$SHIMS/sgl_kernel" "$SHIMS/openjev_torchvision_shim.py" "$SHIMS/openjev_torchvision_shim.pth" "$SITE/"
step import env SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c \
    'import torch, torchvision, sglang, sglang.launch_server, sglang.srt.managers.scheduler, sglang.srt.model_executor.model_runner, sglang.srt.models.llama; print("[setup_sglang_torch] sglang", sglang.__version__, "torch", torch.__version__)'
total
