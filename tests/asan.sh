#!/usr/bin/env bash
# `make test-asan`: memory safety, on AddressSanitizer + UndefinedBehaviorSanitizer builds. The
# sources are copied into build/asan/ and built there with ASAN=1; then the C unit tests run, and
# the pytest cases listed in tests/sanitize.txt drive the sanitized ./sift and test tools once
# through every code path (each strategy and composition, each subcommand, batch jobs with resume
# after a kill, kept maps, every bad-input path). Any report (invalid access, leak, UB) fails the
# run. The rest of the Python suite checks numerics, which a sanitizer does not change: it runs
# once, in `make test`. The fuzz targets are sanitized builds already and run in `make test`.
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
export SIFT_ASAN=1            # tests/test_fidelity_*.py skip (see there)
export SIFT_TIMEOUT_SCALE=4   # sanitized code runs a few times slower
SIFT_PYTEST_ARGS=$(grep -v '^\s*#' tests/sanitize.txt | tr '\n' ' ')
export SIFT_PYTEST_ARGS
make -C "$tree" --no-print-directory ASAN=1 NVCC= -j"$(nproc)" sift test-bins
cd "$tree" && bash tests/run.sh
