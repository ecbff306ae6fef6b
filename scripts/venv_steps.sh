# Sourced by the setup scripts of the real engine servers (setup_sglang_jax.sh, setup_vllm.sh,
# setup_sglang_torch.sh, setup_sglang_router.sh): timed steps and an idempotent side venv. Set
# TAG (the log prefix), VENV (its path in the repo) and SPEC (what it holds) before sourcing,
# and VENV_KEY to anything else that decides its contents (a patch script's hash).
#
# The venv itself lives OUTSIDE the clone, in $OPENJEV_VENV_CACHE (default
# ~/.cache/openjev/venvs) under a name that hashes SPEC and the Python version, and $VENV is a
# symlink to it: CI runs on a clean clone, and each side venv takes minutes to install, so a
# second run (any clone, any branch with the same SPEC) finds it installed by its stamp. A
# changed SPEC gets a new folder (the old one stays until removed by hand). Set
# OPENJEV_VENV_CACHE= (empty) to keep the venv inside the repo as a plain folder; a plain
# folder already at $VENV is used as it is.

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

ensure_venv() {  # the venv at $VENV (a link into the cache), created with $PYTHON when absent
    local cache=${OPENJEV_VENV_CACHE-$HOME/.cache/openjev/venvs} target hash
    if [ -n "$cache" ] && { [ -L "$VENV" ] || [ ! -e "$VENV" ]; }; then
        hash=$( { echo "$SPEC ${VENV_KEY:-}"; "$PYTHON" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-12)
        target="$cache/$(basename "$VENV")-$hash"
        mkdir -p "$cache"
        # One installer at a time per cached venv (two CI runs at once): held until this script exits.
        exec 9>"$target.lock"
        flock 9
        if [ "$(readlink "$VENV" 2>/dev/null)" != "$target" ]; then
            rm -f "$VENV"
            ln -s "$target" "$VENV"
        fi
        echo "[$TAG] venv     $VENV -> $target"
        # The rest of the script installs through the real path: console scripts' shebangs
        # then name the cache folder, not this clone's (gone when the next CI run uses it).
        VENV=$target
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        step venv "$PYTHON" -m venv "$VENV/"
    fi
    echo '*' > "$VENV/.gitignore"  # as Python >= 3.13 venvs do
}

installed() {  # installed STAMP SPEC: true when STAMP records SPEC (else the install runs)
    if [ "$(cat "$1" 2>/dev/null)" = "$2" ]; then
        echo "[$TAG] install  skipped ($2 already installed in ${VENV:-$(dirname "$1")})"
        return 0
    fi
    return 1
}

total() {
    printf '[%s] total    %6s s\n' "$TAG" "$(since "$start")"
}
