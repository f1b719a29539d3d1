"""tests/test_simt_plant.py — the emulated GPU checks can fail: each case plants one bug in a copy
of a CUDA source (build/plant/NAME/kernel.cu), builds gpu_check-simt with it (`make
build/plant/NAME/gpu_check-simt PLANT_FILE=...`: only that kernel object differs) and runs the
gpu_check attention case that exercises it (--small shapes). The bug must be caught, either by the emulator's checkers
(a `simt:` report, exit 3) or by gpu_check rows that no longer agree with the CPU backend
(exit 1, FAIL rows); the test prints which caught it, and asserts the catcher it expects."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_CHECK = os.path.join(ROOT, "build", "tests", "gpu_check-simt")

pytestmark = pytest.mark.skipif(not os.path.exists(GPU_CHECK), reason="no SIMT build (nvcc or clang++ missing)")

COMBINE = re.compile(r"__global__ void attn_combine_kernel.*?\n}\n", re.S)

# name -> (file, [(old, new, count)] or a function of the text, the gpu_check --small attention
# case that runs the kernel (or "ops:": the whole ops section, which holds the weight-type rows;
# "topk:": the topk section, the selectors' and the window scoring's rows),
# catcher, what)
PLANTS = {
    "window-pool-short-edge": (
        "attn/score_cuda.cu", [("hi = j + r >= c ? c - 1 : j + r;", "hi = j + r >= c ? c - 2 : j + r;", 1)],
        "topk:", "rows", "the window scores' pooling leaves out the last candidate at the right edge"),
    "select-tail-shifted": (
        "attn/score_cuda.cu", [("out[k + t] = lo + n + t;", "out[k + t] = lo + n + t - 1;", 1)],
        "topk:", "rows", "the selection's window indices start one entry early"),
    "fold-max-skips-last-head": (
        "attn/score_cuda.cu", [("for (int h = 0; h < heads; h++) m = fmaxf(", "for (int h = 0; h < heads - 1; h++) m = fmaxf(", 1)],
        "topk:", "rows", "specprefill's fold leaves the last head out of the max over heads"),
    "topk-scores-first-head-query": (
        "attn/score_cuda.cu", [("warp_dot(qs + h * hd,", "warp_dot(qs,", 2)],
        "topk:", "rows", "topk's selector scores every query head of a group with the group's first query"),
    "topk-reads-count-duplicates": (
        "attn/score_cuda.cu", [("mine += !seen;", "mine += 1;", 1)],
        "topk:", "rows", "topk's read counts count an entry once per query head that selects it"),
    "topk-attend-drops-last-entry": (
        "attn/phi_cuda.cu", [("return kk + (dlen ? *dlen : len) - n; }", "return kk + (dlen ? *dlen : len) - n - 1; }", 1)],
        "topk:", "rows", "topk's step leaves the newest cache entry out of the attention"),
    "phi-retrieved-keys-of-wrong-kv-head": (
        "attn/phi_cuda.cu", [("int g = r / w.kk / w.group;", "int g = r / w.kk / w.group / 2;", 1)],
        "topk:", "rows", "topk+phi's device step maps the retrieved keys of another KV head"),
    "pages-bound-rounded-inward": (
        "attn/score_cuda.cu", [("b[hd + c] = __float2bfloat16(mx);", "b[hd + c] = __float2bfloat16(mx * 0.99f);", 1)],
        "topk:", "rows", "topk's page bounds put a page's maximum below its largest key"),
    "pages-tail-page-skipped": (
        "attn/score_cuda.cu", [("p < n_pages; p += gridDim.y * DOTS_WARPS) {\n        const bf16 *lo",
                                "p < n_pages - 1; p += gridDim.y * DOTS_WARPS) {\n        const bf16 *lo", 1)],
        "topk:", "rows", "topk's page selector never bounds the last (partial) page"),
    "pages-candidates-of-first-kv-head": (
        "attn/score_cuda.cu", [("t < total) idx[t] = lo + page_entry(pidx, read, size, t / k / group, idx[t]);",
                                "t < total) idx[t] = lo + page_entry(pidx, read, size, t / k / group / 8, idx[t]);", 1)],
        "topk:", "rows", "topk's page selector names every KV head's entries from the first head's pages"),
    "kv-keep-positions-skip-head-0": (
        "backend/kv_cuda.cu", [("    for (int g = 0; g < n_kv_head; g++)\n        for (int j0 = 0;", "    for (int g = 1; g < n_kv_head; g++)\n        for (int j0 = 0;", 1)],
        "topk:", "rows", "a keep by device indices leaves the first KV head's positions where they were"),
    "q4k-scale-of-next-subblock": (
        "backend/qmatmul_cuda.cu", [("k4_scale_min(B + 4, j, &sc, &mn);", "k4_scale_min(B + 4, j ^ 1, &sc, &mn);", 2)],
        "ops:", "rows", "Q4_K/Q5_K groups take the scale and min of their neighbour sub-block"),
    "q6k-dequant-high-bits": (
        "backend/qmatmul_cuda.cu", [("u32at2(B + 128 + 32 * half + l) >> (2 * k);", "u32at2(B + 128 + 32 * half + l) >> k;", 1)],
        "ops:", "rows", "Q6_K's dequantisation (prefill, embed) takes the wrong two high bits"),
    "q6k-product-high-bits": (
        "backend/qmatmul_cuda.cu", [("((u32at2(qh + 4 * i) >> (2 * k)) & 0x03030303u)", "((u32at2(qh + 4 * i) >> k) & 0x03030303u)", 1)],
        "ops:", "rows", "Q6_K's decode product takes the wrong two high bits"),
    "q5-product-high-bit": (
        "backend/qmatmul_cuda.cu", [("spread4(qh >> (16 + 4 * i)) << 4", "spread4(qh >> (12 + 4 * i)) << 4", 1)],
        "ops:", "rows", "Q5_0/Q5_1's decode product takes the fifth bit of the wrong element"),
    "qgemv-reduction-drops-a-lane": (
        "backend/qmatmul_cuda.cu", [("for (int x = 16; x > 0; x >>= 1) t += __shfl_xor_sync", "for (int x = 16; x > 1; x >>= 1) t += __shfl_xor_sync", 3)],
        "ops:", "rows", "the decode kernels' warp sums leave out the last shuffle"),
    "q4k-chunk-scale-top-bits": (
        "backend/qmatmul_cuda.cu", [("(w2 & 0x0F0Fu) | (w0 & 0xC0C0u) >> 2", "(w2 & 0x0F0Fu) | (w1 & 0xC0C0u) >> 2", 1)],
        "ops:", "rows", "the chunk kernel takes sub-blocks 4-7's top scale bits from the min bytes"),
    "q5k-chunk-fifth-bit": (
        "backend/qmatmul_cuda.cu", [("hi[i] |= (k.w[8 + i] >> (2 * p + 1) & 0x01010101u) << 4", "hi[i] |= (k.w[8 + i] >> (2 * p) & 0x01010101u) << 4", 1)],
        "ops:", "rows", "the chunk kernel gives odd sub-blocks the fifth bits of the even ones"),
    "q6k-chunk-high-bits": (
        "backend/qmatmul_cuda.cu", [("(k.w[4 + i] >> (2 * kk + 4) & 0x03030303u) << 4", "(k.w[4 + i] >> (2 * kk + 2) & 0x03030303u) << 4", 1)],
        "ops:", "rows", "the chunk kernel gives Q6_K's high-nibble sub-groups the top bits of the next sub-group"),
    "q6k-chunk-unaligned-words": (
        "backend/qmatmul_cuda.cu", [("w[i] = sh ? (u[i] >> 16 | u[i + 1] << 16) : u[i];", "w[i] = sh ? (u[i + 1] >> 16 | u[i] << 16) : u[i];", 1)],
        "ops:", "rows", "the chunk kernel joins the halves of Q6_K's unaligned words the wrong way round"),
    "qgemv-chunk-skips-blocks": (
        "backend/qmatmul_cuda.cu", [("b0 < nb; b0 += 4 * KU)", "b0 < nb; b0 += 4 * KU + 4)", 1)],
        "ops:", "rows", "the chunk kernel's warp skips 4 blocks after each round of loads"),
    "qgemv-chunk-min-half": (
        "backend/qmatmul_cuda.cu", [("const float2 s1 = ((const float2 *)(xs + (size_t)v * ng + g + dg))[h];",
                                     "const float2 s1 = ((const float2 *)(xs + (size_t)v * ng + g + dg))[0];", 1)],
        "ops:", "rows", "the chunk kernel's mins take the first half's x sum for both halves"),
    "q8-chunk-tail": (
        "backend/qmatmul_cuda.cu", [("w[3] = off ? (u[3] >> 16 | tail << 16) : u[3];", "w[3] = off ? (u[3] >> 16 | tail << 8) : u[3];", 1)],
        "ops:", "rows", "the Q8_0 chunk kernel puts the last two quants of a 2-aligned half in the wrong bytes"),
    "q8-chunk-neighbour-scale": (
        "backend/qmatmul_cuda.cu", [("dh[u] = u16at(B);", "dh[u] = u16at(row + (size_t)(g & ~1) * 34);", 1)],
        "ops:", "rows", "the Q8_0 chunk kernel gives odd blocks the scale of the even block before them "
                        "(caught because gpu_check varies the scale from block to block)"),
    "q8-chunk-skips-blocks": (
        "backend/qmatmul_cuda.cu", [("g0 < ng; g0 += 16 * KU)", "g0 < ng; g0 += 16 * KU + 16)", 1)],
        "ops:", "rows", "the Q8_0 chunk kernel's warp skips 16 blocks after each round of loads"),
    "qgemm-no-barrier-after-step": (
        "backend/qmatmul_cuda.cu", [("        __syncthreads();   // the tiles are overwritten next step\n", "", 1)],
        "ops:", "checker", "the tile kernel overwrites its tiles while other warps still read them"),
    "qgemm-output-columns": (
        "backend/qmatmul_cuda.cu", [("r = r0 + nt * 8 + 2 * tq;", "r = r0 + nt * 8 + tq;", 1)],
        "ops:", "rows", "the tile kernel writes its accumulators to the wrong columns"),
    "qgemm-k-tail-unmasked": (
        "backend/qmatmul_cuda.cu", [("const bool ok = i < n && k < in;", "const bool ok = i < n;", 1)],
        "ops:", "any", "the tile kernel copies x past the end of its rows in the last step"),
    "dequant-chunks-skip-rows": (
        "backend/qmatmul_cuda.cu", [("for (int r0 = 0; r0 < o; r0 += cr) {", "for (int r0 = 0; r0 < o; r0 += cr + 8) {", 1)],
        "ops:", "rows", "the chunked dequantisation skips 8 rows after each chunk"),
    "causal-mask-off-by-one": (
        "attn/attn_prefill_cuda.cu",
        [("pj <= qp[0] ?", "pj <= qp[0] + 1 ?", 1), ("pj <= qp[1] ?", "pj <= qp[1] + 1 ?", 1)],
        "prefill GQA 8/2 hd128 400 trap", "rows", "the prefill kernels' softmax step lets each query see the key after it"),
    "deleted-syncthreads": (
        "attn/attn_prefill_cuda.cu",
        [("cp_async_wait<1>();   // everything but the prefetch just issued has landed\n        __syncthreads();",
          "cp_async_wait<1>();   // everything but the prefetch just issued has landed", 1)],
        "prefill GQA 8/2 hd128 400 trap", "checker", "no barrier between the tile's cp.async landing and its reads"),
    "ldmatrix-row-off-by-one": (
        "attn/attn_prefill_cuda.cu",
        [("ldsm_x4(kb, &ks[(n2 * 16 + lane % 8 + lane / 16 * 8) * LD",
          "ldsm_x4(kb, &ks[(n2 * 16 + lane % 8 + lane / 16 * 8 + 1) * LD", 1)],
        "prefill GQA 8/2 hd128 400 trap", "any", "the K fragments' row addresses one row down"),
    "wait-group-one-too-few": (
        "attn/attn_prefill_cuda.cu",
        [("cp_async_wait<1>();   // everything but", "cp_async_wait<2>();   // everything but", 1)],
        "prefill GQA 8/2 hd128 400 trap", "checker",
        "wait_group 2 where 1 is needed: the tile about to be read may be in flight"),
    "wg-v-layout": (
        "attn/attn_prefill_cuda.cu", [("dv = wg_desc(sm.v[b], 128, BC * 16)", "dv = wg_desc(sm.v[b], 128, BC * 8)", 1)],
        "prefill GQA 8/2 hd128 400 trap", "any", "the V descriptor's stride between 8-dim core matrices is half the layout's"),
    "wg-s-read-before-wait": (
        "attn/attn_prefill_cuda.cu", [("        wg_wait<0>();\n        wg_hold<BC / 2>(&s[0][0]);\n", "", 1)],
        "prefill GQA 8/2 hd128 400 trap", "rows", "the scores are read before wgmma.wait_group completes them"),
    "combine-drops-last-split": (
        "attn/attn_cuda.cu",
        lambda text: COMBINE.sub(lambda m: m.group(0).replace("s < splits;", "s < splits - 1;"), text),
        "decode hd128 len1500 gap2", "rows", "the split-K combine ignores the last split"),
    "decode-reads-key-past-cache": (
        "attn/attn_decode_cuda.cu",
        [("j1 = min(len, j0 + chunk);", "j1 = min(len + 1, j0 + chunk);", 1)],
        "decode hd128 len1500 gap2", "any", "the KV-group decode kernel reads one key past the cache's length"),
}


def plant(name):
    path, edit, _, _, _ = PLANTS[name]
    text = open(os.path.join(ROOT, path)).read()
    if callable(edit):
        out = edit(text)
    else:
        out = text
        for old, new, count in edit:
            assert out.count(old) == count, f"{name}: '{old}' occurs {out.count(old)} times in {path}, not {count}: update the plant"
            out = out.replace(old, new)
    assert out != text, f"{name}: the plant changed nothing in {path}"
    d = os.path.join(ROOT, "build", "plant", name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "kernel.cu"), "w") as f:
        f.write(out)
    b = subprocess.run(["make", "--no-print-directory", "-s", f"build/plant/{name}/gpu_check-simt", f"PLANT_FILE={path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-3000:]
    return os.path.join(d, "gpu_check-simt")


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_planted_bug_is_caught(name):
    _, _, case, want, what = PLANTS[name]
    exe = plant(name)
    args = (["--only", "ops"] if case == "ops:" else ["--only", "topk"] if case == "topk:"
            else ["--only", "attention", "--case", case])
    p = subprocess.run([exe, "--small", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    failed_rows = [l for l in p.stdout.splitlines() if l.startswith("| ") and l.rstrip().endswith("| FAIL |")]
    checker = re.findall(r"^simt: (.*)$", p.stderr, re.M)
    caught = "checker" if p.returncode == 3 and checker else "rows" if p.returncode == 1 and failed_rows else None
    print(f"{name} ({what}): caught by {caught}: " +
          (checker[0] if caught == "checker" else f"{len(failed_rows)} FAIL rows, e.g. {failed_rows[:1]}"))
    assert caught, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    assert want in ("any", caught), (caught, p.stdout[-2000:], p.stderr[-2000:])
