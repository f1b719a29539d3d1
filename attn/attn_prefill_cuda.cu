// attn/attn_prefill_cuda.cu — prefill attention for head dims 64 and 128 in the FlashAttention-2
// form (CPU twin: attn_causal in attn_cpu.c; the older kernels in attn_cuda.cu stay selectable
// with SIFT_ATTN_PREFILL=wmma|flash). One pass over the keys; S and P never leave registers:
//  - a block = BR = 64 query rows of one head, 4 warps, 16 rows each; keys in tiles of BC = 64;
//  - Q, K, V tiles in shared memory with rows padded by 16 bytes, so every ldmatrix phase (8 rows
//    x 16 bytes) hits 8 different bank groups; K/V of the next tile arrive by cp.async while the
//    current one is computed (two buffers);
//  - S = Q K^T and O += P V on the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate);
//    the S accumulator of two adjacent 8-key tiles is, element for element, the A operand of the
//    P V product, so P goes from fp32 registers to bf16 registers with no shared memory;
//  - online softmax in base 2 (scale folded with log2 e), per-thread partial row sums reduced once
//    at the end;
//  - masking by positions (key j visible to query i iff kpos[j] <= qpos[i]); a small pre-kernel
//    writes each 64-key tile's (min, max) position, so blocks skip tiles no query of theirs sees
//    (the causal upper triangle) and unmask tiles every row of a warp sees.
// Fragment layouts are PTX ISA's for mma.m16n8k16 (.bf16): g = lane / 4, t = lane % 4;
// A (16x16): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..);
// B (16x8):  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C (16x8): c0,c1 (g, 2t..), c2,c3 (g+8, 2t..).
#include <limits.h>
#include <stdint.h>

#include "../util/cuda_util.cuh"
#include "attn_cuda.h"

#define BR 64    // query rows per block (16 per warp)
#define BC 64    // keys per tile
#define NW 4     // warps per block

// ---- fragments --------------------------------------------------------------------------------

__device__ static inline uint32_t pack_bf16(float lo, float hi) {   // lo in the low half
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

// ---- tile bounds ------------------------------------------------------------------------------

// mm[g][t] = (min, max) of kpos[g][t*BC .. t*BC + BC) over the first len entries; grid (tiles, n_kv)
__global__ void tile_minmax_kernel(int2 *mm, const int *kpos, int len, int cap) {
    const int t = blockIdx.x, g = blockIdx.y, j = t * BC + threadIdx.x;
    int p = j < len ? kpos[(size_t)g * cap + j] : INT_MAX;
    int lo = p, hi = j < len ? p : INT_MIN;
    for (int o = 16; o > 0; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    __shared__ int2 w[BC / 32];
    if (threadIdx.x % 32 == 0) w[threadIdx.x / 32] = make_int2(lo, hi);
    __syncthreads();
    if (threadIdx.x == 0) {
        int2 r = w[0];
        for (int i = 1; i < BC / 32; i++) r.x = min(r.x, w[i].x), r.y = max(r.y, w[i].y);
        mm[(size_t)g * gridDim.x + t] = r;
    }
}

// ---- the kernel -------------------------------------------------------------------------------

template <int HD>
struct fa2_smem {
    static constexpr int LD = HD + 8;   // padded row, bf16 elements
    bf16 q[BR * LD];
    bf16 k[2][BC * LD];
    bf16 v[2][BC * LD];
    int kp[2][BC];
};

// q (n, heads, HD), K/V (n_kv_head, cap, HD) -> out (n, heads, HD); grid (ceil(n / BR), heads),
// NW * 32 threads, sizeof(fa2_smem<HD>) dynamic shared memory. mm: tile_minmax_kernel's table.
template <int HD>
__global__ void __launch_bounds__(NW * 32)
attn_fa2_kernel(bf16 *out, attn_cuda_args a, const int2 *mm, float scale_log2) {
    SHARED_DYNAMIC(unsigned char, smem_raw);
    fa2_smem<HD> &sm = *(fa2_smem<HD> *)smem_raw;
    constexpr int LD = fa2_smem<HD>::LD, CH = HD / 8;   // 16-byte chunks per row
    __shared__ int qlo_s[NW], qhi_s[NW];
    const int nqb = gridDim.x, qb = nqb - 1 - blockIdx.x;   // the longest rows start first
    const int h = blockIdx.y, g = h / (a.heads / a.n_kv_head), i0 = qb * BR;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gr = lane / 4, tq = lane % 4;
    const int ntiles = (a.len + BC - 1) / BC;
    const bf16 *q = (const bf16 *)a.q, *kg = (const bf16 *)a.k + (size_t)g * a.cap * HD;
    const bf16 *vg = (const bf16 *)a.v + (size_t)g * a.cap * HD;
    const int2 *mmg = mm + (size_t)g * ntiles;

    // Q tile (rows past n read as zeros)
    for (int e = tid; e < BR * CH; e += NW * 32) {
        int r = e / CH, c = e % CH * 8, i = i0 + r;
        const bf16 *src = q + ((size_t)(i < a.n ? i : 0) * a.heads + h) * HD + c;
        cp_async16(&sm.q[r * LD + c], src, i < a.n);
    }
    // query positions: this thread's two rows, and the warp's range
    const int r0 = i0 + warp * 16 + gr, r1 = r0 + 8;
    const int qp0 = r0 < a.n ? a.qpos[r0] : INT_MIN, qp1 = r1 < a.n ? a.qpos[r1] : INT_MIN;
    {
        int lo = min(r0 < a.n ? qp0 : INT_MAX, r1 < a.n ? qp1 : INT_MAX), hi = max(qp0, qp1);
        for (int o = 16; o > 0; o >>= 1) {
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
            hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        }
        if (lane == 0) qlo_s[warp] = lo, qhi_s[warp] = hi;
    }
    __syncthreads();
    int qmax = INT_MIN;
    for (int w = 0; w < NW; w++) qmax = max(qmax, qhi_s[w]);
    const int wlo = qlo_s[warp];   // every row of this warp sees a key at position <= wlo

    // K/V/positions of tile t into buffer b
    auto load_tile = [&](int t, int b) {
        const int j0 = t * BC;
        for (int e = tid; e < BC * CH; e += NW * 32) {
            int r = e / CH, c = e % CH * 8, j = j0 + r;
            size_t o = (size_t)(j < a.len ? j : 0) * HD + c;
            cp_async16(&sm.k[b][r * LD + c], kg + o, j < a.len);
            cp_async16(&sm.v[b][r * LD + c], vg + o, j < a.len);
        }
        if (tid < BC) {
            int j = j0 + tid;
            sm.kp[b][tid] = j < a.len ? a.kpos[(size_t)g * a.cap + j] : INT_MAX;
        }
    };
    auto next_visible = [&](int t) {   // first tile >= t with a key some row of the block sees
        while (t < ntiles && mmg[t].x > qmax) t++;
        return t;
    };

    int t = next_visible(0);
    if (t < ntiles) load_tile(t, 0);
    cp_async_commit();   // group: Q (+ the first tile)

    // registers: Q fragments, O accumulator, softmax state of rows gr and gr + 8
    uint32_t qf[HD / 16][4];
    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
    bool have_q = false;

    for (int b = 0; t < ntiles; b ^= 1) {
        int tn = next_visible(t + 1);
        if (tn < ntiles) load_tile(tn, b ^ 1);
        cp_async_commit();
        cp_async_wait<1>();   // everything but the prefetch just issued has landed
        __syncthreads();
        if (!have_q) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                ldsm_x4(qf[kk], &sm.q[(warp * 16 + lane % 16) * LD + kk * 16 + lane / 16 * 8]);
            have_q = true;
        }
        const bf16 *ks = sm.k[b], *vs = sm.v[b];
        const int *kp = sm.kp[b];

        // S (16 x BC) = Q K^T
        float s[BC / 8][4];
#pragma unroll
        for (int n = 0; n < BC / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int n2 = 0; n2 < BC / 16; n2++) {
                uint32_t kb[4];   // keys n2*16 + 0..7 (kb0, kb1) and + 8..15 (kb2, kb3)
                ldsm_x4(kb, &ks[(n2 * 16 + lane % 8 + lane / 16 * 8) * LD + kk * 16 + lane / 8 % 2 * 8]);
                mma16816(s[2 * n2], qf[kk], kb[0], kb[1]);
                mma16816(s[2 * n2 + 1], qf[kk], kb[2], kb[3]);
            }

        // mask, scale (base 2), running max
        // every key of the tile exists and is visible to every row of this warp: no mask
        const bool full = mmg[t].y <= wlo && (t + 1) * BC <= a.len;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < BC / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int pj = kp[n * 8 + 2 * tq + e];
                s[n][e] = full || pj <= qp0 ? s[n][e] * scale_log2 : -INFINITY;
                s[n][2 + e] = full || pj <= qp1 ? s[n][2 + e] * scale_log2 : -INFINITY;
                mx0 = fmaxf(mx0, s[n][e]), mx1 = fmaxf(mx1, s[n][2 + e]);
            }
#pragma unroll
        for (int x = 1; x < 4; x <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
        }
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float base0 = mn0 == -INFINITY ? 0.0f : mn0, base1 = mn1 == -INFINITY ? 0.0f : mn1;
        const float c0 = ex2(m0 - base0), c1 = ex2(m1 - base1);   // m = -inf: 0
        m0 = mn0, m1 = mn1;
        l0 *= c0, l1 *= c1;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) o[d][0] *= c0, o[d][1] *= c0, o[d][2] *= c1, o[d][3] *= c1;

        // P = 2^(s - m) in bf16 A fragments; O += P V
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            float p[8];
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {
                const float *sn = s[2 * kk + h2];
                p[4 * h2 + 0] = ex2(sn[0] - base0), p[4 * h2 + 1] = ex2(sn[1] - base0);
                p[4 * h2 + 2] = ex2(sn[2] - base1), p[4 * h2 + 3] = ex2(sn[3] - base1);
                l0 += p[4 * h2] + p[4 * h2 + 1], l1 += p[4 * h2 + 2] + p[4 * h2 + 3];
            }
            uint32_t pa[4] = {pack_bf16(p[0], p[1]), pack_bf16(p[2], p[3]), pack_bf16(p[4], p[5]),
                              pack_bf16(p[6], p[7])};
#pragma unroll
            for (int d2 = 0; d2 < HD / 16; d2++) {
                uint32_t vb[4];   // dims d2*16 + 0..7 (vb0, vb1) and + 8..15 (vb2, vb3)
                ldsm_x4_t(vb, &vs[(kk * 16 + lane % 8 + lane / 8 % 2 * 8) * LD + d2 * 16 + lane / 16 * 8]);
                mma16816(o[2 * d2], pa, vb[0], vb[1]);
                mma16816(o[2 * d2 + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads();   // buffer b is read; the prefetch after next overwrites it
        t = tn;
    }
    cp_async_wait<0>();

    // row sums over the 4 lanes of a row; out = O / l (rows with no visible key: zeros)
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, x);
        l1 += __shfl_xor_sync(0xffffffffu, l1, x);
    }
    const float inv0 = l0 > 0 ? 1.0f / l0 : 0.0f, inv1 = l1 > 0 ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        int c = d * 8 + 2 * tq;
        if (r0 < a.n)
            *(__nv_bfloat162 *)&out[((size_t)r0 * a.heads + h) * HD + c] =
                __floats2bfloat162_rn(o[d][0] * inv0, o[d][1] * inv0);
        if (r1 < a.n)
            *(__nv_bfloat162 *)&out[((size_t)r1 * a.heads + h) * HD + c] =
                __floats2bfloat162_rn(o[d][2] * inv1, o[d][3] * inv1);
    }
}

// ---- host side --------------------------------------------------------------------------------

size_t attn_fa2_work_floats(const attn_cuda_args *a) {
    size_t tiles = (size_t)(a->len + BC - 1) / BC;
    return tiles * a->n_kv_head * (sizeof(int2) / sizeof(float));
}

template <int HD>
static void launch(bf16 *out, const attn_cuda_args *a, int2 *mm, cudaStream_t st) {
    size_t smem = sizeof(fa2_smem<HD>);
    static bool configured;   // opt in to > 48 KiB of dynamic shared memory, once per process
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_fa2_kernel<HD>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    dim3 grid((unsigned)((a->n + BR - 1) / BR), (unsigned)a->heads);
    CUDA_LAUNCH(attn_fa2_kernel<HD>, grid, NW * 32, smem, st, out, *a, mm,
                1.4426950408889634f / sqrtf((float)HD));
}

int attn_fa2_takes(const attn_cuda_args *a) { return a->hd == 64 || a->hd == 128; }

void attn_fa2_cuda(void *out, const attn_cuda_args *a, float *work, cudaStream_t st) {
    if (a->n == 0) return;
    int tiles = (a->len + BC - 1) / BC;
    int2 *mm = (int2 *)work;
    if (tiles > 0) {
        CUDA_LAUNCH(tile_minmax_kernel, dim3((unsigned)tiles, (unsigned)a->n_kv_head), BC, 0, st,
                    mm, a->kpos, a->len, a->cap);
    }
    if (a->hd == 64) launch<64>((bf16 *)out, a, mm, st);
    else launch<128>((bf16 *)out, a, mm, st);
}
