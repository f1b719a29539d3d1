#!/usr/bin/env bash
# Runs every libFuzzer target for SECONDS each (default 10) on a corpus grown under build/fuzz,
# seeded from small valid inputs the tests make. Fails on the first crash, leak or UB report;
# the input that did it is left in build/fuzz/ as crash-* (make it a regression test).
# usage: fuzz/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
out=build/fuzz
mkdir -p "$out"/seed_gguf "$out"/seed_tok "$out"/corpus_gguf "$out"/corpus_tok "$out"/seed_phi \
    "$out"/corpus_phi
.venv/bin/python - <<'PY'
import json, sys
sys.path.insert(0, "tests")
import tiny_gguf
tiny_gguf.write("build/fuzz/seed_gguf/tiny.gguf", n_layer=1, d=32, n_head=2, n_kv=1, ff=32)
for i, line in enumerate(open("tests/data/tok_strings.jsonl")):
    if i % 10 == 0:
        open(f"build/fuzz/seed_tok/{i}.txt", "w").write(json.loads(line)["text"])
import struct  # a valid .phi file: 1 layer, 2/1 heads, MLP 4 -> 4 -> 8 -> 4
npar = 4 * 4 + 4 + 8 * 4 + 8 + 4 * 8 + 4 + 1 + 4 * 4 + 4
open("build/fuzz/seed_phi/tiny.phi", "wb").write(
    b"SIFTPHI\0" + struct.pack("<10I", 1, 1, 1, 2, 1, 4, 4, 8, 4, 0) + bytes(4 * 3 * npar))
PY
export SIFT_FUZZ_MODEL="$(realpath "${SIFT_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}")"
for target in gguf tok phi; do
    log="$out/fuzz_$target.log"
    if ! (cd "$out" && "./fuzz_$target" -max_total_time="$secs" -max_len=70000 -print_final_stats=1 \
            "corpus_$target" "seed_$target") > "$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "fuzz_$target: FAILED after $secs s (input in $out/crash-*)" >&2
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz_$target: $runs executions in $secs s, no crash"
done
