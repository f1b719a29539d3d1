#!/usr/bin/env bash
# bench/simt_profile.sh — emulated hardware counters for the attention kernels, no GPU needed.
# Builds nothing. Runs the timing rows of the SIMT emulation build (gpu_check-simt --only speed:
# one Llama-3.1-8B layer, 32 query heads, 8 KV heads, hd 128, at 8192 and then 32768 keys) with
# SIMT_PROFILE, running SAMPLE blocks per launch (default 4: two per worker on 2 cores). Both
# sizes land in one profile, summed per kernel (the binary has no switch for one size). Sampling
# leaves most of the key positions and the per-tile bounds unwritten (their upload kernels are
# sampled too), so every sampled prefill block computes all key tiles: the blocks are alike and a
# few suffice (simt_roofline.py halves the prefill counts to the causal triangle). Then compiles the
# kernel sources with nvcc --resource-usage for sm_90a (the Makefile's NVFLAGS) into a temporary
# directory and writes per kernel: registers, static shared memory, stack and spill bytes.
# Finally bench/simt_roofline.py joins the two into markdown tables (bench/CUDA.md).
# Usage: bench/simt_profile.sh [OUTDIR]   (default build/simt_profile; env SAMPLE, NVCC)
# Takes 3-6 minutes on a 2-core machine at SAMPLE=4.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/simt_profile}
sample=${SAMPLE:-4}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
bin=build/tests/gpu_check-simt
[ -x "$bin" ] || { echo "simt_profile: $bin missing (make $bin)" >&2; exit 2; }
mkdir -p "$out"

t0=$(date +%s)
SIMT_PROFILE="$out/profile.json" SIMT_SAMPLE_BLOCKS="$sample" "$bin" --only speed > "$out/speed.txt"
echo "emulated run: $(( $(date +%s) - t0 )) s at SIMT_SAMPLE_BLOCKS=$sample" | tee "$out/run.txt"

# ptxas prints, per entry function: "Compiling entry function 'MANGLED' for 'sm_90a'", then
# "N bytes stack frame, N bytes spill stores, N bytes spill loads", then
# "Used N registers, used N barriers, N bytes smem". One TSV row each, the name demangled last.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in attn/*.cu backend/*.cu; do
    "$nvcc" -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --resource-usage \
        -c "$f" -o "$tmp/$(basename "$f" .cu).o" 2>&1
done > "$tmp/ptxas.txt"
{
    printf 'regs\tsmem\tstack\tspill_stores\tspill_loads\tkernel\n'
    awk -F"'" '/Compiling entry function/ { name = $2 }
        /bytes stack frame/ { split($0, w, " "); stack = w[1]; st = w[5]; ld = w[9] }
        /Used [0-9]+ registers/ {
            match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
            smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
            printf "%s\t%s\t%s\t%s\t%s\t%s\n", regs, smem, stack, st, ld, name }' "$tmp/ptxas.txt" |
        c++filt
} > "$out/resources.tsv"
cp "$tmp/ptxas.txt" "$out/ptxas.txt"

python3 bench/simt_roofline.py "$out/profile.json" "$out/resources.tsv" --sample "$sample" | tee "$out/roofline.md"
