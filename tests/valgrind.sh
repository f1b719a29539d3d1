#!/usr/bin/env bash
# `make test-valgrind`: sift under valgrind memcheck — one end-to-end prompt through every strategy
# (the A/B run shares one load), then the error paths (bad model file, truncated model, bad
# options, missing prompt, a KV cache beyond memory, a bad draft). Fails on any invalid access,
# use of uninitialised memory, or definite/indirect leak, and on a wrong exit code. Slow
# (minutes), so not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'GGML\0\0\0\0' > "$tmp/bad.gguf"
head -c 5000000 "$model" > "$tmp/trunc.gguf"
vg() {   # expected-exit-code args...
    local want=$1 rc=0
    shift
    # OPENBLAS_CORETYPE set: sift would otherwise re-execute itself to pick OpenBLAS's kernels
    # (backend/backend.h), and the new process would run outside valgrind
    OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Prescott} OMP_WAIT_POLICY=passive valgrind -q --error-exitcode=99 --leak-check=full \
        --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
        ./sift -t 1 -q "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
    if [ "$rc" != "$want" ]; then
        cat "$tmp/err" >&2
        echo "valgrind: FAILED (exit $rc, expected $want): sift $*" >&2
        exit 1
    fi
    echo "valgrind: clean, exit $rc: sift $*"
}
vg 0 -m "$model" -p "The capital of France is" -n 4 --temp 0 --strategy "${STRATEGIES:-all}"
vg 1 -m "$tmp/bad.gguf" -p hi
vg 1 -m "$tmp/trunc.gguf" -p hi
vg 1 -m "$tmp/none.gguf" -p hi
vg 2 -m "$model" -p hi --strategy fastkv --tsp-layer 99
vg 1 -m "$model" -f "$tmp/none.txt"
vg 1 -m "$model" -p hi -c 4194304 -n -1
vg 1 -m "$model" -p hi --strategy specprefill --draft "$tmp/bad.gguf"
