#!/usr/bin/env bash
# Runs the GPU op checks under compute-sanitizer: memcheck (out-of-bounds and misaligned accesses,
# leaks) and racecheck (shared-memory hazards). The model checks are left out (--ops-only): under
# the sanitizer they take many minutes and add no kernel the op checks do not run (nor do the
# ceilings: an 8192^3 GEMM under memcheck).
# usage: tests/gpu_sanitize.sh build/tests/gpu_check
set -u
bin=${1:-build/tests/gpu_check}
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -z "$san" ]; then
    echo "gpu_sanitize: compute-sanitizer not found (CUDA toolkit bin/)" >&2
    exit 1
fi
rc=0
for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool"
    extra=""
    [ "$tool" = memcheck ] && extra="--leak-check full"
    "$san" --tool "$tool" $extra --error-exitcode 9 "$bin" --ops-only || { echo "gpu_sanitize: $tool failed" >&2; rc=1; }
done
exit $rc
