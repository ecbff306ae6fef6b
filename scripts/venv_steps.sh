# Sourced by the setup scripts of the real engine servers (setup_sglang_jax.sh, setup_vllm.sh):
# timed steps and an idempotent side venv. Set TAG (the log prefix) and VENV before sourcing.

start=$(date +%s%N)

since() {  # seconds since a `date +%s%N` stamp, one decimal
    local ds=$(( ($(date +%s%N) - $1) / 100000000 ))
    echo "$((ds / 10)).$((ds % 10))"
}

step() {  # step LABEL COMMAND...: run it and print how long it took
    local label=$1 t0; shift
    t0=$(date +%s%N)
    "$@"
    printf '[%s] %-8s %6s s\n' "$TAG" "$label" "$(since "$t0")"
}

ensure_venv() {  # the venv at $VENV, created with $PYTHON when absent, kept out of `git status`
    if [ ! -x "$VENV/bin/python" ]; then
        step venv "$PYTHON" -m venv "$VENV"
    fi
    echo '*' > "$VENV/.gitignore"  # as Python >= 3.13 venvs do
}

installed() {  # installed STAMP SPEC: true when STAMP records SPEC (else the install runs)
    if [ "$(cat "$1" 2>/dev/null)" = "$2" ]; then
        echo "[$TAG] install  skipped ($2 already installed in $VENV)"
        return 0
    fi
    return 1
}

total() {
    printf '[%s] total    %6s s\n' "$TAG" "$(since "$start")"
}
