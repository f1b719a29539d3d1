#!/usr/bin/env bash
# bench/gpu.sh — everything a GPU machine session does, in one call of under 9 minutes, from the
# repo root: GPU facts, the carried binaries (or a build there), the PTX fragment tables the SIMT
# emulator implements checked on the device (build/tests/gpu_tables), make test-gpu's checks (with the
# attention kernels timed alone), the compute-sanitizer runs, `sift bench` on synthetic shapes and
# the PyTorch peer (bench/torch_peer.py) on the first bench's shape. Logs go to $OUT (or bench/out);
# a short table comes last.
#
# Build machine (nvcc, no GPU needed):   make -j2 sift build/tests/gpu_check build/tests/gpu_tables \
#                                          && bench/gpu.sh --pack
#   (--pack copies stripped binaries to .gpu/, git-ignored; carry it: the device tool's carry=[".gpu"])
# GPU machine:                           bash bench/gpu.sh
# Edit BENCH below to change what is benchmarked (flags of `sift bench`, see sift bench --help).
set -u
BENCH=(
    "-m synthetic:llama-3.1-8b --device cuda --strategy full -p 8192,32768 -n 64 -r 2"
    "-m synthetic:llama-3.1-8b --wtype q4_k --device cuda --strategy full -p 1024,8192 -n 32 -r 2"
    "-m synthetic:llama-3.1-8b --device cuda --strategy full -p 1024 -n 32 -r 1 --parallel 1,8,64"
    "-m synthetic:llama-3.1-8b --wtype q4_k --device cuda --strategy full -p 1024 -n 32 -r 1 --parallel 1,8,16,64"
    "-m synthetic:llama-3.1-8b --device cuda --strategy all -p 8192,32768 -n 32 -r 1"
    "-m synthetic:llama-3.1-8b --device cuda --strategy full,specprefill --draft synthetic:llama-3.2-1b -p 32768 -n 32 -r 1"
    "-m synthetic:llama-3.1-8b --wtype q4_k --device cuda --strategy all -p 32768 -n 32 -r 1"
    "-m synthetic:llama-3.1-8b --wtype q4_k --device cuda --strategy full,topk,topk+phi --selector pages -p 32768 -n 32 -r 1"
    "-m synthetic:llama-3.1-8b --wtype q4_k --device cuda --strategy full,topk --selector pages -p 131000 -n 32 -r 1"
)
LIMIT_S=${GPU_LIMIT_S:-530}   # stop starting new steps after this many seconds
PACK=.gpu

if [ "${1:-}" = --pack ]; then   # plus a small GGUF (tokenizer included) for the end-to-end runs
    rm -rf "$PACK" && mkdir -p "$PACK"
    for b in sift build/tests/gpu_check build/tests/gpu_tables; do   # stripped, gzipped: ~8 MB each
        strip -o "$PACK/$(basename $b)" $b && gzip -9 "$PACK/$(basename $b)" || exit 1
    done
    .venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); import tiny_gguf, gguf; \
tiny_gguf.write('$PACK/tiny-llama.gguf', n_layer=4, d=256, n_head=4, n_kv=2, ff=512, ctx=4096, \
dtype=gguf.GGMLQuantizationType.F16, seed=3); \
import test_gpu_simt; test_gpu_simt.mixed_gguf('$PACK/tiny-mixed.gguf')" || exit 1
    ls -l "$PACK"
    exit 0
fi

OUT=${OUT:-bench/out}
mkdir -p "$OUT"
declare -a ROWS
row() { ROWS+=("| $1 | $2 | $3 |"); }
left() { echo $((LIMIT_S - SECONDS)); }

# step NAME SECONDS LOG CMD...: runs CMD under a time limit (cut to what is left), logs it.
step() {
    local name=$1 lim=$2 log=$3
    shift 3
    local l=$(left)
    if [ "$l" -lt 20 ]; then row "$name" skipped "out of time"; return 1; fi
    [ "$lim" -gt "$l" ] && lim=$l
    echo "== $name (limit ${lim}s): $*" | tee -a "$OUT/gpu.log"
    local t0=$SECONDS
    timeout "$lim" "$@" >"$OUT/$log" 2>&1
    local rc=$?
    tail -n 40 "$OUT/$log" >>"$OUT/gpu.log"
    row "$name" "$([ $rc = 0 ] && echo ok || echo "FAIL rc=$rc")" "$((SECONDS - t0)) s, $OUT/$log"
    return $rc
}

# the strategies' predicted times (sift bench --dry-run, the H200's rates: bench/CUDA.md "Predicted
# ratios") to read beside bench 5-7's measured ones, and bench 5's device counters per strategy
# (h2d/d2h bytes, syncs, allocations, launches, graph replays: issue 57's counters test, on hardware)
PREDICT="-m synthetic:llama-3.1-8b --device cuda --dry-run --strategy all -p 8192,32768 -n 32"
COUNTERS="-m synthetic:llama-3.1-8b --device cuda --strategy all -p 8192 -n 8 -r 1 --format jsonl"

# cuBLASLt 13: sift dlopens it; point SIFT_CUBLASLT at a copy when the loader cannot find one
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt.so.13' && [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
    export SIFT_CUBLASLT=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' -type f 2>/dev/null | head -n 1)
    echo "gpu.sh: SIFT_CUBLASLT=$SIFT_CUBLASLT" | tee -a "$OUT/gpu.log"
fi

# GPU facts
if ! nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv \
        >"$OUT/nvidia-smi.txt" 2>&1; then
    cat "$OUT/nvidia-smi.txt"
    echo "gpu.sh: nvidia-smi failed: no GPU here" >&2
    exit 1
fi
row nvidia-smi ok "$(tail -n 1 "$OUT/nvidia-smi.txt")"

# binaries: the carried ones when they start here, else a build here (needs the static libs)
BIN=/tmp/sift-gpu
mkdir -p $BIN
for b in sift gpu_check gpu_tables; do [ -f "$PACK/$b.gz" ] && gzip -dc "$PACK/$b.gz" >$BIN/$b && chmod +x $BIN/$b; done
SIFT=$BIN/sift CHECK=$BIN/gpu_check TABLES=$BIN/gpu_tables
if ! "$SIFT" --version >"$OUT/version.txt" 2>&1 || ! [ -x "$CHECK" ]; then
    echo "gpu.sh: no carried binaries that run here; building" | tee -a "$OUT/gpu.log"
    step build 240 build.log make -j16 sift build/tests/gpu_check build/tests/gpu_tables \
        CUARCH="-gencode arch=compute_90,code=sm_90"
    SIFT=./sift CHECK=build/tests/gpu_check TABLES=build/tests/gpu_tables
    "$SIFT" --version >"$OUT/version.txt" 2>&1
fi
row binaries "$(head -c 60 "$OUT/version.txt")" "$SIFT, $CHECK"

# the fragment tables (mma.m16n8k16, ldmatrix x1/x2/x4 .trans), cp.async groups, shuffles, wgmma,
# graphs as tests/test_simt.cpp states them: the emulator passes the same checks in make test
step "PTX tables on the device (test_simt)" 60 tables.log "$TABLES"
TINY=$PACK/tiny-llama.gguf
# most valuable first: a call cut short still has the checks and the 8B numbers
step "sift --device cuda (tiny GGUF)" 60 smoke_cuda.log "$SIFT" -m "$TINY" --device cuda \
    -p "the cat sat on the mat" -n 24 --temp 0 --strategy full,speed,fastkv,snapkv,streamingllm,specprefill
step "test-gpu (ops + strategies)" 200 test_gpu.log "$CHECK" "$TINY"
# every strategy on a model whose weights stay in five GGUF block types (backend/qmatmul_cuda.cu)
step "test-gpu on GGUF blocks (tiny-mixed.gguf)" 60 test_gpu_mixed.log "$CHECK" --only gguf "$PACK/tiny-mixed.gguf"
i=0
for b in "${BENCH[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    step "sift bench $i" 120 "bench_$i.log" "$SIFT" bench $b
    if [ $i = 1 ]; then   # the PyTorch peer on bench 1's shape and contexts, in the same call
        step "pytorch peer (bench/torch_peer.py)" 150 torch.log python3 bench/torch_peer.py \
            --shape llama-3.1-8b --ctx 8192,32768 -n 64
        # full's prefill attention by the wgmma kernel (SIFT_ATTN_PREFILL=wg), the A/B of fa2w
        # (the default) against the same peer
        # shellcheck disable=SC2086
        step "sift bench 1, SIFT_ATTN_PREFILL=wg" 120 bench_1_wg.log env SIFT_ATTN_PREFILL=wg \
            "$SIFT" bench $b
    fi
    if [ $i = 5 ]; then   # the device counters of every strategy (one JSON line each)
        # shellcheck disable=SC2086
        step "sift bench, device counters" 90 counters.jsonl "$SIFT" bench $COUNTERS
    fi
    if [ $i = 4 ]; then   # batched Q4_K decode by dequantisation + cuBLASLt, the A/B of the tile kernel
        # shellcheck disable=SC2086
        step "sift bench 4, SIFT_CUDA_QGEMM_ROWS=0" 120 bench_4_dq.log env SIFT_CUDA_QGEMM_ROWS=0 \
            "$SIFT" bench $b
    fi
    if [ $i = 4 ]; then   # the strategy rows come next: their predictions first (no GPU work)
        # shellcheck disable=SC2086
        step "sift bench --dry-run (predicted)" 30 bench_0_predicted.log "$SIFT" bench $PREDICT
    fi
    if [ $i = 2 ]; then   # Q4_K decode by the group kernel, the A/B of the chunk kernel (the default)
        # shellcheck disable=SC2086
        step "sift bench 2, SIFT_CUDA_QGEMV=group" 120 bench_2_group.log env SIFT_CUDA_QGEMV=group \
            "$SIFT" bench $b
    fi
done
step "compute-sanitizer memcheck+racecheck" 150 sanitize.log bash tests/gpu_sanitize.sh "$CHECK"
step "sift --device cpu (tiny GGUF)" 60 smoke_cpu.log "$SIFT" -m "$TINY" --device cpu \
    -p "the cat sat on the mat" -n 24 --temp 0 --strategy full,speed,fastkv,snapkv,streamingllm,specprefill

# bench 2's GGUF blocks against the same weights converted to bf16 at load (the A/B of
# backend/qmatmul_cuda.cu)
step "sift bench 2, SIFT_CUDA_WEIGHTS=bf16" 120 bench_2_bf16.log env SIFT_CUDA_WEIGHTS=bf16 "$SIFT" bench \
    -m synthetic:llama-3.1-8b --wtype q4_k --device cuda --strategy full -p 1024,8192 -n 32 -r 2

# what holds the GGUF-block decode kernel back (issue 38: Q4_K decode read 29 % of the bandwidth
# and no profiler had run): Nsight Compute's throughput, memory, warp-state and occupancy sections
# on 8 qgemv launches of an 8B Q4_K decode step (a layer takes 7; the one-token prefill's 224 are
# skipped; eager launches: no graph to look inside;
# --clock-control none: ncu would otherwise lock the clocks, and the card's settings stay as they are)
# (the chunk kernel, the default, then the group kernel)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute*/ncu 2>/dev/null | head -n 1)
for k in chunk group; do
    if [ -n "$NCU" ]; then
        step "ncu: qgemv ($k) of the 8B Q4_K decode" 150 ncu_qgemv_$k.log env SIFT_CUDA_GRAPHS=0 SIFT_CUDA_QGEMV=$k \
            "$NCU" --clock-control none --kernel-name regex:qgemv --launch-skip 240 --launch-count 8 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
            --section LaunchStats \
            "$SIFT" bench -m synthetic:llama-3.1-8b --wtype q4_k --device cuda --strategy full -p 1 -n 8 -r 1
    else
        row "ncu: qgemv ($k) of the 8B Q4_K decode" skipped "no ncu on this machine"
    fi
done

# the decode step replayed as a CUDA graph (the default) against the same launches run eagerly
step "sift bench 1, SIFT_CUDA_GRAPHS=0" 120 bench_nographs.log env SIFT_CUDA_GRAPHS=0 "$SIFT" bench \
    -m synthetic:llama-3.1-8b --device cuda --strategy full -p 8192 -n 64 -r 2

# fit-phi's logging prefill on each device (the fit itself is CPU): the two quality tables should
# agree to about bf16's precision
for dev in cpu cuda; do
    step "fit-phi --device $dev (tiny GGUF)" 60 "fit_$dev.log" "$SIFT" fit-phi -m "$TINY" --data README.md \
        -c 1024 --steps 10 --queries 16 --device $dev -o "$OUT/tiny_$dev.phi" -t 16
done

echo
echo "## gpu.sh on $(tail -n 1 "$OUT/nvidia-smi.txt"), $(date -u +%F), $(head -c 40 "$OUT/version.txt")"
grep -h "passed, .* failed" "$OUT"/test_gpu.log "$OUT"/test_gpu_mixed.log 2>/dev/null
grep -h "test_simt:\|FAIL" "$OUT"/tables.log 2>/dev/null
for dev in cpu cuda; do echo "$dev: $(grep -h "^| full\|^| speed" "$OUT/smoke_$dev.log" 2>/dev/null | cut -c1-150)"; done
grep -h "FAIL" "$OUT"/test_gpu.log 2>/dev/null | head -n 20
grep -h "ERROR SUMMARY\|failed" "$OUT"/sanitize.log 2>/dev/null | head -n 6
for dev in cpu cuda; do echo "fit-phi $dev: $(grep -h "^| mean" "$OUT/fit_$dev.log" 2>/dev/null)"; done
grep -h "^| attn \(prefill\|decode\)\|^| ceilings" "$OUT"/test_gpu.log 2>/dev/null
[ -f "$OUT/counters.jsonl" ] && python3 -c "import json, sys
for l in open(sys.argv[1]):
    if l.startswith('{'):
        r = json.loads(l); print('counters', r['strategy'], json.dumps(r.get('device_counters')))" "$OUT/counters.jsonl"
for f in "$OUT"/bench_*.log "$OUT"/torch.log; do
    [ -f "$f" ] && echo "$(basename "$f"):" && grep -h "^|" "$f" | grep -v "^|---"
done
for k in chunk group; do
    grep -h "qgemv\|DRAM Throughput\|Memory Throughput\|Achieved Occupancy\|Registers Per Thread\|Warp Cycles Per Issued" \
        "$OUT"/ncu_qgemv_$k.log 2>/dev/null | head -n 24
done
echo
echo "| step | result | detail |"
echo "|---|---|---|"
printf '%s\n' "${ROWS[@]}"
