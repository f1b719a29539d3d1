#!/bin/bash
# bench/pack_job.sh — the short-prompt batch job of issue 37: 24 prompts of 60-240 words (slices
# of README.md, random.seed(37)), -n 32, greedy, on the default model; wall time one-by-one
# (--parallel 1) against --parallel 8 with packed prefill and --parallel 8 without it
# (SIFT_PACK_ROWS=0), interleaved, REPS times (default 3), THREADS threads (default 1). Prints one
# line per run (wall seconds and the summary's prefill and decode ms) and checks every run's texts
# equal the first one-by-one run's. usage: bench/pack_job.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
reps=${REPS:-3}
threads=${THREADS:-1}
mkdir -p "$out"
python3 - "$out/job24.jsonl" <<'EOF'
import json, random, sys
words = open("README.md").read().split()
rng = random.Random(37)
with open(sys.argv[1], "w") as f:
    for i in range(24):
        n = rng.randint(60, 240)
        s = rng.randrange(0, len(words) - n)
        f.write(json.dumps({"id": f"p{i:02d}", "prompt": " ".join(words[s:s + n])}) + "\n")
EOF
for r in $(seq 1 "$reps"); do
    for mode in p1 p8 p8-unpacked; do
        par=8 rows=
        [ "$mode" = p1 ] && par=1
        [ "$mode" = p8-unpacked ] && rows=0
        t0=$(date +%s.%N)
        env ${rows:+SIFT_PACK_ROWS=$rows} ./sift --prompts "$out/job24.jsonl" -n 32 --temp 0 -t "$threads" \
            --parallel "$par" --output "$out/$mode-$r.jsonl" --summary "$out/$mode-$r.summary.json" -q
        t1=$(date +%s.%N)
        python3 - "$out" "$mode" "$r" "$t0" "$t1" <<'EOF'
import json, sys
out, mode, r, t0, t1 = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
s = json.load(open(f"{out}/{mode}-{r}.summary.json"))
texts = [json.loads(l)["text"] for l in open(f"{out}/{mode}-{r}.jsonl")]
ref = [json.loads(l)["text"] for l in open(f"{out}/p1-1.jsonl")]
print(f"{mode} rep {r}: wall {t1 - t0:.2f} s, prefill {s['prefill_ms'] / 1e3:.2f} s, decode "
      f"{s['decode_ms'] / 1e3:.2f} s, texts equal to one-by-one: {sum(a == b for a, b in zip(texts, ref))}/{len(ref)}")
EOF
    done
done
