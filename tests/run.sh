#!/usr/bin/env bash
# `make test`: the include graph of the rooms (tests/layers.py), the C unit tests, the fuzz
# targets (FUZZ_SECONDS each), then the Python reference and end-to-end tests (pytest), spread over
# the machine's cores (pytest-xdist, one test file per worker: a file's module fixtures are built
# once). Each step prints how long it took.
# SIFT_TEST_JOBS=N sets the workers (1: one process, in file order); SIFT_SKIP_FUZZ=1 skips fuzzing;
# SIFT_PYTEST_ARGS replaces the test selection (default: every tests/test_*.py).
set -u
cd "$(dirname "$0")/.."
rc=0
step() { # step NAME CMD...: runs CMD, prints its wall time, remembers a failure
    local name=$1 t0=$SECONDS
    shift
    "$@" || { echo "make test: $name failed" >&2; rc=1; }
    echo "make test: $name took $((SECONDS - t0)) s" >&2
}
# OpenBLAS's kernels are the ones it (or sift, on an AVX-512 CPU it does not know) picks for this
# CPU, not an inherited OPENBLAS_CORETYPE: the tests that compare runs bit for bit (a chunked
# prefill against one pass, batched f32 rows against each alone) rest on the attention's sgemm giving
# a row the same sums whatever the call's other rows, which the AVX-512 kernels do and the Haswell
# ones forced onto an AVX-512 CPU do not (a row's sums depend on the call's row count: 2e-3 in the logits).
unset OPENBLAS_CORETYPE SIFT_BLAS_DETECTED
step "include graph" .venv/bin/python tests/layers.py
bins=()
for t in build/tests/test_*; do
    case "$t" in *.o | *.d) ;; *) bins+=("$t") ;; esac
done
step "C unit tests" bash tests/run_c.sh "${bins[@]}"
[ -n "${SIFT_SKIP_FUZZ:-}" ] || step "fuzzing" bash fuzz/run.sh "${FUZZ_SECONDS:-10}"
jobs=${SIFT_TEST_JOBS:-$(nproc)}
par=()
if [ "$jobs" -gt 1 ]; then
    par=(-n "$jobs" --dist loadfile)
    # sift's default thread count follows how busy the machine is (backend_cpu_default_threads):
    # beside another worker it would change from run to run, and with it the summation order,
    # so that runs a test compares bit for bit could differ. Each worker gets its share of cores.
    cores=$(nproc)
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / jobs > 0 ? cores / jobs : 1))}
    # A test that asks for more threads (-t 2) than its share shares cores with the other
    # workers' processes: OpenMP threads that spin while they wait then run many times slower
    # (a barrier waits for a thread that is not running); waiting threads sleep instead. Results
    # do not depend on it (the same threads do the same work).
    export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
fi
# shellcheck disable=SC2086
step "pytest" env SIFT_MODEL="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}" \
    .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "${par[@]}" ${SIFT_PYTEST_ARGS:-tests}
exit $rc
