#!/usr/bin/env bash
# Runs each C unit-test binary given as an argument; fails if any fails.
set -u
rc=0
for t in "$@"; do
    "$t" || { echo "C test failed: $t" >&2; rc=1; }
done
exit $rc
