#!/usr/bin/env bash
# `make test`: the include graph (tests/layers.py), the C unit tests, then the Python reference and
# end-to-end tests (pytest).
set -u
cd "$(dirname "$0")/.."
rc=0
.venv/bin/python tests/layers.py || rc=1
bins=()
for t in build/tests/test_*; do
    case "$t" in *.o | *.d) ;; *) bins+=("$t") ;; esac
done
bash tests/run_c.sh "${bins[@]}" || rc=1
[ -n "${SIFT_SKIP_FUZZ:-}" ] || bash fuzz/run.sh "${FUZZ_SECONDS:-10}" || rc=1
SIFT_MODEL="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}" .venv/bin/python -m pytest -q tests || rc=1
exit $rc
