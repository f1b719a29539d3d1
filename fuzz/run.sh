#!/usr/bin/env bash
# Runs every libFuzzer target for SECONDS each (default 10) on a corpus grown under build/fuzz,
# seeded from small valid inputs the tests make. Fails on the first crash, leak or UB report;
# the input that did it is left in build/fuzz/ as crash-* (make it a regression test).
# usage: fuzz/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
out=build/fuzz
mkdir -p "$out"/seed_gguf "$out"/seed_tok "$out"/seed_cli "$out"/corpus_gguf "$out"/corpus_tok \
    "$out"/corpus_cli "$out"/seed_safetensors "$out"/corpus_safetensors "$out"/seed_phi "$out"/corpus_phi \
    "$out"/seed_requests "$out"/corpus_requests "$out"/seed_resume "$out"/corpus_resume \
    "$out"/seed_pcache "$out"/corpus_pcache
.venv/bin/python - <<'PY'
import json, sys
sys.path.insert(0, "tests")
import tiny_gguf
tiny_gguf.write("build/fuzz/seed_gguf/tiny.gguf", n_layer=1, d=32, n_head=2, n_kv=1, ff=32)
import numpy as np
from safetensors.numpy import save_file
save_file({"a": np.ones((2, 3), np.float32), "b": np.zeros(4, np.float16)},
          "build/fuzz/seed_safetensors/tiny.safetensors", metadata={"format": "pt"})
for i, line in enumerate(open("tests/data/tok_strings.jsonl")):
    if i % 10 == 0:
        open(f"build/fuzz/seed_tok/{i}.txt", "w").write(json.loads(line)["text"])
# argument lists, NUL-separated, shaped like the examples of README and docs/usage.md
for i, args in enumerate([
        ["-p", "hi", "--chat", "-n", "32", "--temp", "0"],
        ["-f", "a.txt", "-f", "b.txt", "--json", "-q", "--seed", "7", "--top-p", "0.9"],
        ["-f", "x", "--strategy", "full,speed,fastkv,specprefill", "--kv-rate", "0.2",
         "--pool-kernel", "7", "--keep", "0.3", "--draft-layers", "4", "--anchor", "none",
         "--keep-last", "off"],
        ["-f", "x", "--strategy", "fastkv,snapkv", "--kv-len", "512", "--tsp-len", "2048",
         "--pool", "avg", "--window", "8"],
        ["-p", "x", "--strategy", "all", "--device", "cpu", "-t", "2", "-c", "4096", "--min-p", "0"],
        ["--prompts", "r.jsonl", "--parallel", "4", "--output", "o.jsonl", "--resume",
         "--shard", "1/3", "--unordered", "--swiftkv-norm", "own"],
        ["bench", "-p", "512,2048", "-n", "16", "-r", "2", "--strategy", "full,fastkv", "--format", "jsonl"],
        ["eval", "--strategy", "all", "--tasks", "niah,vt", "--n-prompt", "1024,2048", "--samples", "2",
         "--seed", "1", "-o", "r.json", "--plot", "r.svg", "--device", "cpu"],
        ["sweep", "-f", "a.txt", "--grid", "fastkv:kv-rate=0.05,0.1:tsp-rate=0.1,0.2;specprefill:keep=0.1",
         "-n", "16", "--min-agreement", "0.9", "-o", "s.json", "--csv", "s.csv", "--plot", "s.svg"],
        ["sweep", "--tasks", "niah,multikey", "--n-prompt", "4096", "--samples", "2", "--strategy",
         "fastkv,topk,fastkv+topk", "--fidelity", "accuracy", "--speed", "ttft", "--parallel", "4"],
        ["ppl", "-f", "wiki.txt", "-c", "512", "--json"],
        ["fit-phi", "--data", "t.txt", "-c", "1024", "-o", "m.phi", "--seed", "3"],
        # regressions: inputs a fuzz run once failed on
        ["fit-phi", "--data", "4", "--seed", "0", "-o", "r", "--ctx", "5504", "--steps", "0", "-o", "enc"],
        ["-p", "x", "--strategy", "swiftkv,topk+phi", "--swiftkv-layers", "15", "--budget", "0.05",
         "--sink", "4", "--tail", "16", "--phi", "m.phi"]]):
    open(f"build/fuzz/seed_cli/{i}.args", "wb").write("\0".join(args).encode())
import struct  # a valid .phi file: 1 layer, 2/1 heads, MLP 4 -> 4 -> 8 -> 4
npar = 4 * 4 + 4 + 8 * 4 + 8 + 4 * 8 + 4 + 1 + 4 * 4 + 4
tiny = b"SIFTPHI\0" + struct.pack("<10I", 1, 1, 1, 2, 1, 4, 4, 8, 4, 0) + bytes(4 * 3 * npar)
open("build/fuzz/seed_phi/tiny.phi", "wb").write(tiny)
verdict = b"the fitted maps win (fit-phi check)"   # with the optional verdict record
open("build/fuzz/seed_phi/verdict.phi", "wb").write(tiny + struct.pack("<I", len(verdict)) + verdict)
# request files (fuzz_requests: the first byte picks --chat, then JSON Lines): sift's fields and
# OpenAI Batch lines, honoured, accepted and refused fields, a bad line and a repeated id
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
shapes = [
    [{"id": "a", "prompt": "hello", "n_predict": 8, "temp": 0.5, "seed": 3, "strategy": "fastkv"},
     {"id": 7, "messages": msgs, "system": "s", "stop": ["x", "y"], "frequency_penalty": 1},
     {"prompt": "no id", "presence_penalty": -2}, {"id": "a", "prompt": "again"}, "{bad json"],
    [{"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
      "body": {"model": "m", "messages": msgs, "max_tokens": 5, "temperature": 0, "top_p": 0.9,
               "seed": 1, "stop": "\n", "n": 2, "frequency_penalty": 0.5, "presence_penalty": 0.5,
               "user": "u", "metadata": {"k": "v"}, "logprobs": False, "response_format": {"type": "text"}}},
     {"custom_id": "c2", "method": "POST", "url": "/v1/completions",
      "body": {"prompt": "The capital", "max_tokens": 3, "stop": ["a", "b", "c", "d"], "echo": False, "best_of": 1}},
     {"custom_id": "c3", "method": "GET", "url": "/v1/embeddings", "body": {"input": "x"}},
     {"custom_id": "c4", "method": "POST", "url": "/v1/chat/completions",
      "body": {"messages": [{"role": "developer", "content": "d"}, {"role": "user", "content": [{"type": "text", "text": "t"}]}],
               "tools": [{"type": "function"}], "logit_bias": {"1": 2}, "n": None}},
     {"custom_id": "c5", "body": {"prompt": [1, 2], "max_completion_tokens": 2}}]]
for i, rows in enumerate(shapes):
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    open(f"build/fuzz/seed_requests/{i}.jsonl", "wb").write(bytes([i]) + text.encode())
# --prompt-cache files (policies/prompt_cache.h's layout) of tiny shapes: f32, f16 and q8_0 rows,
# whole, cut short, and with a byte of the rows changed (its checksum no longer holds)
import struct
def fnv_words(b):
    h, M = 1469598103934665603, (1 << 64) - 1
    i = 0
    while i + 8 <= len(b):
        h = ((h ^ int.from_bytes(b[i:i + 8], "little")) * 1099511628211) & M
        i += 8
    for c in b[i:]:
        h = ((h ^ c) * 1099511628211) & M
    return h
ROW = {0: lambda hd: 4 * hd, 2: lambda hd: 2 * hd, 3: lambda hd: hd // 32 * 34}
for kt, vt, layers, heads, hd, n in [(0, 0, 1, 1, 32, 3), (2, 2, 2, 2, 32, 5), (3, 2, 1, 2, 64, 4)]:
    names = [b"tiny", b"cpu", b"native"]
    head = b"SIFTKVC\0" + struct.pack("<11I", 1, layers, heads, hd, kt, vt, 2048, n, *map(len, names))
    head += struct.pack("<Q", 0x1234) + b"".join(names) + struct.pack(f"<{n}I", *range(1, n + 1))
    body = bytes((7 * i) % 251 for i in range(layers * heads * n * (ROW[kt](hd) + ROW[vt](hd))))
    f = head + body
    f += struct.pack("<Q", fnv_words(f))
    tag = f"{kt}{vt}_{layers}x{heads}x{hd}_{n}"
    open(f"build/fuzz/seed_pcache/{tag}.bin", "wb").write(f)
    open(f"build/fuzz/seed_pcache/{tag}.cut.bin", "wb").write(f[:-20])
    bad = bytearray(f)
    bad[len(head) + 1] ^= 1
    open(f"build/fuzz/seed_pcache/{tag}.bad.bin", "wb").write(bytes(bad))
PY
# the resume reader: real records of both shapes (tests/data/resume_seed_*.jsonl), whole and as
# an interrupted run leaves them (a last line cut short, a damaged middle line)
for f in tests/data/resume_seed_*.jsonl; do
    b=$(basename "$f" .jsonl)
    cp "$f" "$out/seed_resume/$b.jsonl"
    head -c -40 "$f" > "$out/seed_resume/$b.cut.jsonl"
    { head -n 1 "$f"; head -n 2 "$f" | tail -n 1 | head -c 30; echo; tail -n +3 "$f"; } > "$out/seed_resume/$b.damaged.jsonl"
    { head -n 1 "$f" | tr -d '\n'; head -n 1 "$f" | tr -d '\n'; head -n 1 "$f" | tr -d '\n'; head -n 1 "$f" | tr -d '\n'
      head -n 1 "$f" | tr -d '\n'; echo; tail -n +2 "$f"; } > "$out/seed_resume/$b.long.jsonl"   # past the target's line bound
done
export SIFT_FUZZ_MODEL="$(realpath "${SIFT_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}")"
# one target per core at a time (each for SECONDS, on its own core: the same executions as one
# after another, in a fraction of the wall time)
fuzz_one() {
    local target=$1 log="$out/fuzz_$1.log"
    # the CLI target: a usage error's allocations are left behind on purpose (the process would
    # exit), and the help and error text it prints is muted
    local flags="-detect_leaks=1" asan=""
    [ "$target" = cli ] && flags="-detect_leaks=0 -close_fd_mask=3" asan="detect_leaks=0"
    if ! (cd "$out" && ASAN_OPTIONS="$asan" "./fuzz_$target" -max_total_time="$secs" -max_len=70000 -print_final_stats=1 \
            $flags \
            "corpus_$target" "seed_$target") > "$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "fuzz_$target: FAILED after $secs s (input in $out/crash-*)" >&2
        return 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz_$target: $runs executions in $secs s, no crash"
}
jobs_max=$(nproc)
rc=0 running=0
for target in gguf tok safetensors phi cli requests resume pcache; do
    if [ "$running" -ge "$jobs_max" ]; then
        wait -n || rc=1
        running=$((running - 1))
    fi
    fuzz_one "$target" &
    running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
    wait -n || rc=1
    running=$((running - 1))
done
exit $rc
