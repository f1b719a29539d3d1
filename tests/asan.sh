#!/usr/bin/env bash
# `make test-asan`: the whole CPU test suite (C unit tests + pytest) against binaries built with
# AddressSanitizer + UndefinedBehaviorSanitizer. The sources are copied into build/asan/ and built
# there with ASAN=1, so the suite runs unchanged on the sanitized ./sift and test tools; any
# report (invalid access, leak, UB) makes the run fail. The fuzz targets are sanitized already and
# are not run again here.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/asan
mkdir -p "$tree"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$tree"
ln -sfn "$PWD/models" "$tree/models"
ln -sfn "$PWD/.venv" "$tree/.venv"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export SIFT_SKIP_FUZZ=1
export SIFT_ASAN=1            # tests/test_fidelity.py skips (see there)
export SIFT_TIMEOUT_SCALE=4   # sanitized code runs a few times slower
make -C "$tree" --no-print-directory ASAN=1 NVCC= -j"$(nproc)" sift test-bins
cd "$tree" && bash tests/run.sh
