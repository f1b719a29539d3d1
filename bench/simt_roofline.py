#!/usr/bin/env python3
"""bench/simt_roofline.py — joins the emulator's per-kernel counters (SIMT_PROFILE JSON) with
nvcc's resource usage (bench/simt_profile.sh's TSV) and prints two markdown tables:
  1. per kernel: launch configuration, registers, H100 occupancy and what limits it, barriers per
     block, shared-memory wavefronts per request (and against the bytes' ideal), global sectors
     per request, global bytes per launch;
  2. per attention kernel and cache size: FLOPs, global and shared bytes, a roofline floor on an
     H100 SXM (compulsory bytes) and an estimate from the emulated bytes.
Usage: simt_roofline.py PROFILE.json RESOURCES.tsv [--sizes 8192,32768] [--sample N]
(N: the run's SIMT_SAMPLE_BLOCKS, 0 for none).
The profile holds both sizes of gpu_check --only speed summed per kernel; table 2 splits a
kernel's emulated bytes over the sizes in proportion to its dominant term (N^2 prefill, N decode).
With --sample > 0, every sampled prefill block ran all key tiles (the sampled-out blocks of the
upload kernels never wrote the positions and tile bounds that let blocks skip the causal upper
triangle), so table 2 halves the prefill kernels' bytes to the causal triangle (table 1's
barriers and bytes of those rows are for full rows)."""
import argparse
import json

# H100 SXM (sm_90)
TENSOR, FP32, HBM = 989e12, 67e12, 3.35e12      # dense bf16 tensor FLOP/s, fp32 FLOP/s, B/s
SMEM_BW = 128 * 132 * 1.83e9                     # shared memory: 128 B/clock/SM at 1.83 GHz
REGS_SM, SUBPARTS, REG_UNIT = 65536, 4, 256      # registers per SM, in 4 sub-partitions
SMEM_SM, SMEM_RESERVED, SMEM_UNIT = 228 * 1024, 1024, 128
MAX_BLOCKS, MAX_WARPS = 32, 64
HEADS, KV_HEADS, HD = 32, 8, 128                 # Llama-3.1-8B attention shape


def key(signature):  # "void f<128>(int, ...)" -> "f<128>"
    name = signature.split("(")[0].strip()
    return " ".join(name[5:].split() if name.startswith("void ") else name.split())


def occupancy(threads, regs, smem):
    """(blocks per SM, warps per SM, limiting resources) as cuda_occupancy.h computes them."""
    warps = -(-threads // 32)
    per_warp = max(1, -(-regs * 32 // REG_UNIT)) * REG_UNIT
    limits = {
        "registers": (REGS_SM // SUBPARTS // per_warp) * SUBPARTS // warps,
        "shared memory": SMEM_SM // (-(-(smem + SMEM_RESERVED) // SMEM_UNIT) * SMEM_UNIT),
        "warps": MAX_WARPS // warps,
        "blocks": MAX_BLOCKS,
    }
    blocks = min(limits.values())
    return blocks, blocks * warps, " + ".join(k for k, v in limits.items() if v == blocks)


def kind(k):
    for name, what in (("attn_fa2_kernel", "prefill"), ("attn_wg_kernel", "prefill"),
                       ("attn_group_kernel", "decode")):
        if k.startswith(name):
            return what
    return None


def fmt(x, digits=3):
    if x == 0:
        return "0"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g} {unit}"
    return f"{x:.{digits}g}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("resources")
    ap.add_argument("--sizes", default="8192,32768")
    ap.add_argument("--sample", type=int, default=0)   # the run's SIMT_SAMPLE_BLOCKS
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    res = {}
    with open(args.resources) as f:
        next(f)
        for line in f:
            regs, smem, stack, spill_st, spill_ld, name = line.rstrip("\n").split("\t")
            res[key(name)] = dict(regs=int(regs), smem=int(smem), stack=int(stack),
                                  spill=int(spill_st) + int(spill_ld))
    prof = json.load(open(args.profile))

    print("| kernel | launches | threads/block | smem dyn + static (B) | regs | stack / spill (B) "
          "| blocks/SM | warps/SM | limited by | barriers/block | shared wavefronts/req "
          "| vs ideal | global sectors/req | B/sector | global bytes/launch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for p in sorted(prof, key=lambda p: -p["global_bytes"] - 1e3 * p["mma"]):
        k = key(p["kernel"])
        r = res.get(k)
        smem_static = r["smem"] if r else 0
        occ = occupancy(int(p["threads_per_block"]), r["regs"], p["dyn_smem"] + smem_static) \
            if r else ("?", "?", "no nvcc entry")
        sh_bytes = p["shared_read_bytes"] + p["shared_write_bytes"]
        req = p["shared_requests"]
        ideal = max(req, sh_bytes / 128)   # one wavefront moves at most 128 bytes
        print(f"| `{k}` | {p['launches']} | {p['threads_per_block']} "
              f"| {p['dyn_smem']} + {smem_static} | {r['regs'] if r else '?'} "
              f"| {r['stack'] if r else '?'} / {r['spill'] if r else '?'} "
              f"| {occ[0]} | {occ[1]} | {occ[2]} "
              f"| {p['barriers'] / p['blocks']:.4g} "
              f"| {p['shared_wavefronts'] / req if req else 0:.3g} "
              f"| {p['shared_wavefronts'] / ideal if req else 0:.3g} "
              f"| {p['global_sectors'] / p['global_requests'] if p['global_requests'] else 0:.3g} "
              f"| {p['global_bytes'] / p['global_sectors'] if p['global_sectors'] else 0:.3g} "
              f"| {fmt(p['global_bytes'] / p['launches'])} |")
        if kind(k):
            rows.append((k, p))
    print("\nvs ideal: wavefronts over max(requests, shared bytes / 128), 1.0 = no bank conflict "
          "(a 16-byte access by a warp needs 4 wavefronts at best).")

    print("\n| kernel | keys | FLOP/launch | global bytes/launch (emulated) | compulsory bytes "
          "| shared bytes/launch (emulated) | FLOP/global B | FLOP/shared B "
          "| floor: FLOP, compulsory bytes | bound | estimate: FLOP, emulated bytes | bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for k, p in rows:
        pre = kind(k) == "prefill"
        peak = TENSOR if pre else FP32
        weights = [n * n if pre else n for n in sizes]
        scale = 0.5 if pre and args.sample > 0 else 1.0   # sampled prefill: every tile
        for n, w in zip(sizes, weights):
            share = scale * w / sum(weights) / (p["launches"] / len(sizes))
            flop = 4 * HEADS * HD * n * n / 2 if pre else 4 * HEADS * HD * n
            glob = p["global_bytes"] * share
            shared = (p["shared_read_bytes"] + p["shared_write_bytes"]) * share
            need = n * (2 * HEADS + 2 * KV_HEADS) * HD * 2 if pre else 2 * n * KV_HEADS * HD * 2
            floor = {"compute": flop / peak, "HBM": need / HBM}
            est = {"compute": flop / peak, "HBM": glob / HBM, "shared": shared / SMEM_BW}
            print(f"| `{k}` | {n} | {fmt(flop)} | {fmt(glob)} | {fmt(need)} | {fmt(shared)} "
                  f"| {flop / glob:.3g} | {flop / shared:.3g} "
                  f"| {max(floor.values()) * 1e6:.4g} us | {max(floor, key=floor.get)} "
                  f"| {max(est.values()) * 1e6:.4g} us | {max(est, key=est.get)} |")
    fa2 = [p for k, p in rows if k.startswith("attn_fa2_kernel")]
    if fa2:
        full = sum(4 * HEADS * HD * n * n for n in sizes) * fa2[0]["launches"] / len(sizes)
        print(f"\nfa2: mma x 4096 = {fmt(fa2[0]['mma'] * 4096)} FLOP over the run = "
              f"{fa2[0]['mma'] * 4096 / full:.3f} x the full-row (non-causal) count.")
    print("Peaks: prefill kernels 989 TFLOP/s (bf16 tensor), decode kernels 67 TFLOP/s (fp32 CUDA "
          "cores); HBM 3.35 TB/s; shared memory 128 B/clock/SM x 132 SMs x 1.83 GHz = 30.9 TB/s "
          "(the tensor peak needs 32 FLOP per shared byte). Floor: max(FLOP/peak, compulsory "
          "bytes/HBM), compulsory = prefill q, out, K, V once, decode K and V once. Estimate: "
          "max(FLOP/peak, emulated global bytes/HBM, emulated shared bytes/shared bandwidth), as if "
          "no global byte hit a cache and no shared access conflicted.")


if __name__ == "__main__":
    main()
