#!/usr/bin/env bash
# CPU benchmark for bench/RESULTS.md: prefill and decode speed (+ MFU / MBU against the ceilings
# the bench measures) at 512 and 2048 prompt tokens
# with the default model. Usage: bench/bench.sh [THREADS] [REPS]   (defaults: 2, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
reps=${2:-3}
make -s sift model >&2
echo "# $(date -u +%F) $(git rev-parse --short HEAD) $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
echo "# ./sift bench -p 512,2048 -n 128 -r $reps -t $threads"
./sift bench -p 512,2048 -n 128 -r "$reps" -t "$threads"
