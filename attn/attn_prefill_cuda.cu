// attn/attn_prefill_cuda.cu — prefill attention for head dims 64 and 128 in the FlashAttention-2
// form (CPU twin: attn_causal_cpu in attn_cpu.c; attn_cuda.cu's flash kernel takes the other head
// dims). One pass over the keys; S and P never leave registers:
//  - a block = 4 warps of 32 ("fa2w") query rows of one head, or of 16 ("fa2": where fa2w's
//    shared memory at head dim 128, 102.5 KiB, exceeds what a block may have, as the 99 KiB of
//    compute capability 8.6 and 8.9); keys in tiles of BC = 64;
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
// A third kernel, attn_wg_kernel ("wg", sm_90a; below), runs the same pass on Hopper's wgmma:
// warpgroups of 64 rows whose K and V the tensor cores read from shared memory once for all 64.
// The softmax step, P's fragments, the output and the position bounds are device functions all
// three share.
// Fragment layouts are PTX ISA's for mma.m16n8k16 (.bf16): g = lane / 4, t = lane % 4;
// A (16x16): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..);
// B (16x8):  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C (16x8): c0,c1 (g, 2t..), c2,c3 (g+8, 2t..).
#include <limits.h>
#include <stdint.h>

#include "../util/cuda_util.cuh"
#include "attn_cuda.h"
extern "C" {
#include "../util/tunables.h"
}

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

// ---- one 16-row tile's softmax and output (both kernels; s, o in the accumulator layout:
// [n][0..1] row gr, [n][2..3] row gr + 8, columns 8n + 2 tq + 0..1) ---------------------------

// The online-softmax step of a tile of BC scores: mask by position (key j is visible to a row iff
// kp[j] <= its position qp[0] or qp[1]; full: every key visible), scale to base 2, update the
// running maxima m and sums l, rescale O; base: the new maxima (0 while a row sees nothing)
template <int HD>
__device__ static inline void softmax_step(float (*s)[4], const int *kp, const int *qp, bool full,
                                           float scale_log2, float *m, float *l, float (*o)[4],
                                           float *base, int tq) {
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < BC / 8; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int pj = kp[n * 8 + 2 * tq + e];
            s[n][e] = full || pj <= qp[0] ? s[n][e] * scale_log2 : -INFINITY;
            s[n][2 + e] = full || pj <= qp[1] ? s[n][2 + e] * scale_log2 : -INFINITY;
            mx0 = fmaxf(mx0, s[n][e]), mx1 = fmaxf(mx1, s[n][2 + e]);
        }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
    base[0] = mn0 == -INFINITY ? 0.0f : mn0, base[1] = mn1 == -INFINITY ? 0.0f : mn1;
    const float c0 = ex2(m[0] - base[0]), c1 = ex2(m[1] - base[1]);   // m = -inf: 0
    m[0] = mn0, m[1] = mn1;
    l[0] *= c0, l[1] *= c1;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] *= c0, o[d][1] *= c0, o[d][2] *= c1, o[d][3] *= c1;
}

// P = 2^(s - base) of keys 16 kk .. 16 kk + 15 as the bf16 A fragment of P V (the accumulator
// of two 8-key tiles is, element for element, mma.m16n8k16's A); l += their sums
__device__ static inline void p_fragment(const float (*s)[4], int kk, const float *base, float *l,
                                         uint32_t *pa) {
    float p[8];
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
        const float *sn = s[2 * kk + h2];
        p[4 * h2 + 0] = ex2(sn[0] - base[0]), p[4 * h2 + 1] = ex2(sn[1] - base[0]);
        p[4 * h2 + 2] = ex2(sn[2] - base[1]), p[4 * h2 + 3] = ex2(sn[3] - base[1]);
        l[0] += p[4 * h2] + p[4 * h2 + 1], l[1] += p[4 * h2 + 2] + p[4 * h2 + 3];
    }
    pa[0] = pack_bf16(p[0], p[1]), pa[1] = pack_bf16(p[2], p[3]);
    pa[2] = pack_bf16(p[4], p[5]), pa[3] = pack_bf16(p[6], p[7]);
}

// out rows rr[0] (gr) and rr[1] (gr + 8) = O / l, l summed over the row's 4 lanes (rows with no
// visible key: zeros; rows past n: not written)
template <int HD>
__device__ static inline void store_rows(bf16 *out, const float (*o)[4], const float *l, const int *rr,
                                         const attn_cuda_args &a, int h, int tq) {
    float inv[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        float le = l[e];
#pragma unroll
        for (int x = 1; x < 4; x <<= 1) le += __shfl_xor_sync(0xffffffffu, le, x);
        inv[e] = le > 0 ? 1.0f / le : 0.0f;
    }
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        int c = d * 8 + 2 * tq;
#pragma unroll
        for (int e = 0; e < 2; e++)
            if (rr[e] < a.n)
                *(__nv_bfloat162 *)&out[((size_t)rr[e] * a.heads + h) * HD + c] =
                    __floats2bfloat162_rn(o[d][2 * e] * inv[e], o[d][2 * e + 1] * inv[e]);
    }
}

// The block's largest query position (qmax) and its warp's smallest (wlo), from this lane's
// lo and hi over its rows; qlo_s, qhi_s: nw ints of shared memory each. A block barrier.
__device__ static inline void position_bounds(int lo, int hi, int *qlo_s, int *qhi_s, int nw, int *qmax,
                                              int *wlo) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int o = 16; o > 0; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    if (lane == 0) qlo_s[warp] = lo, qhi_s[warp] = hi;
    __syncthreads();
    int m = INT_MIN;
    for (int w = 0; w < nw; w++) m = max(m, qhi_s[w]);
    *qmax = m, *wlo = qlo_s[warp];
}

// ---- the kernel -------------------------------------------------------------------------------

// MT = 16-row tiles of queries per warp: 1 (block of 64 rows, "fa2") or 2 (128 rows, "fa2w"). With
// MT = 2 every K and V fragment a warp loads from shared memory feeds two mma.sync instead of one,
// so the shared-memory bytes per FLOP halve; the cost is registers (O and S twice as large), so at
// HD = 128 the Q fragments are re-read from shared memory for each tile instead of held (a third
// as many bytes as K's, still 26 FLOP per shared byte against 16 for MT = 1).
template <int HD, int MT>
struct fa2_smem {
    static constexpr int LD = HD + 8;   // padded row, bf16 elements
    static constexpr int ROWS = NW * 16 * MT;
    bf16 q[ROWS * LD];
    bf16 k[2][BC * LD];
    bf16 v[2][BC * LD];
    int kp[2][BC];
};

// q (n, heads, HD), K/V (n_kv_head, cap, HD) -> out (n, heads, HD); grid (ceil(n / ROWS), heads),
// NW * 32 threads, sizeof(fa2_smem<HD, MT>) dynamic shared memory. mm: tile_minmax_kernel's table.
// One body of ~150 lines, kept whole on purpose: the accumulators (O fragments, row max and sum)
// live in registers across the tile loop, and the staging, scores, softmax and P @ V steps read
// as the FlashAttention-2 loop they are.
template <int HD, int MT>
__global__ void __launch_bounds__(NW * 32)
attn_fa2_kernel(bf16 *out, attn_cuda_args a, const int2 *mm, float scale_log2) {
    SHARED_DYNAMIC(unsigned char, smem_raw);
    typedef fa2_smem<HD, MT> smem_t;
    smem_t &sm = *(smem_t *)smem_raw;
    constexpr int LD = smem_t::LD, CH = HD / 8, ROWS = smem_t::ROWS;   // CH: 16-byte chunks per row
    constexpr bool QREG = MT * HD <= 128;   // Q fragments held in registers for the whole pass
    __shared__ int qlo_s[NW], qhi_s[NW];
    const int nqb = gridDim.x, qb = nqb - 1 - blockIdx.x;   // the longest rows start first
    const int h = blockIdx.y, g = h / (a.heads / a.n_kv_head), i0 = qb * ROWS;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gr = lane / 4, tq = lane % 4;
    const int ntiles = (a.len + BC - 1) / BC;
    const bf16 *q = (const bf16 *)a.q, *kg = (const bf16 *)a.k + (size_t)g * a.cap * HD;
    const bf16 *vg = (const bf16 *)a.v + (size_t)g * a.cap * HD;
    const int2 *mmg = mm + (size_t)g * ntiles;

    // Q tile (rows past n read as zeros)
    for (int e = tid; e < ROWS * CH; e += NW * 32) {
        int r = e / CH, c = e % CH * 8, i = i0 + r;
        const bf16 *src = q + ((size_t)(i < a.n ? i : 0) * a.heads + h) * HD + c;
        cp_async16(&sm.q[r * LD + c], src, i < a.n);
    }
    // query rows and positions: this thread's rows in tile mt are row(mt, 0) and row(mt, 1) (8
    // below); the warp's range of positions
    auto row = [&](int mt, int e) { return i0 + (warp * MT + mt) * 16 + gr + 8 * e; };
    int qp[MT][2], lo = INT_MAX, hi = INT_MIN;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int i = row(mt, e);
            qp[mt][e] = i < a.n ? a.qpos[i] : INT_MIN;
            if (i < a.n) lo = min(lo, qp[mt][e]);
            hi = max(hi, qp[mt][e]);
        }
    int qmax, wlo;   // every row of this warp sees a key at position <= wlo
    position_bounds(lo, hi, qlo_s, qhi_s, NW, &qmax, &wlo);

    // K/V/positions of tile t into buffer b
    auto load_tile = [&](int t, int b) {
        const int j0 = t * BC;
        for (int e = tid; e < BC * CH; e += NW * 32) {
            int rr = e / CH, c = e % CH * 8, j = j0 + rr;
            size_t o = (size_t)(j < a.len ? j : 0) * HD + c;
            cp_async16(&sm.k[b][rr * LD + c], kg + o, j < a.len);
            cp_async16(&sm.v[b][rr * LD + c], vg + o, j < a.len);
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
    // the A fragment of Q for tile mt, dims kk*16 .. +16
    auto load_q = [&](uint32_t *f, int mt, int kk) {
        ldsm_x4(f, &sm.q[((warp * MT + mt) * 16 + lane % 16) * LD + kk * 16 + lane / 16 * 8]);
    };

    int t = next_visible(0);
    if (t < ntiles) load_tile(t, 0);
    cp_async_commit();   // group: Q (+ the first tile)

    // registers: Q fragments (QREG), O accumulators, softmax state of rows gr and gr + 8 per tile
    uint32_t qf[QREG ? MT : 1][QREG ? HD / 16 : 1][4];
    float o[MT][HD / 8][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int d = 0; d < HD / 8; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0;
        m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0;
    }
    bool have_q = false;

    for (int b = 0; t < ntiles; b ^= 1) {
        int tn = next_visible(t + 1);
        if (tn < ntiles) load_tile(tn, b ^ 1);
        cp_async_commit();
        cp_async_wait<1>();   // everything but the prefetch just issued has landed
        __syncthreads();
        if (QREG && !have_q) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) load_q(qf[QREG ? mt : 0][QREG ? kk : 0], mt, kk);
            have_q = true;
        }
        const bf16 *ks = sm.k[b], *vs = sm.v[b];
        const int *kp = sm.kp[b];

        // S (16 x BC per tile) = Q K^T: each K fragment feeds the MT query tiles
        float s[MT][BC / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < BC / 8; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t qa[QREG ? 1 : MT][4];
            if (!QREG)
#pragma unroll
                for (int mt = 0; mt < MT; mt++) load_q(qa[QREG ? 0 : mt], mt, kk);
#pragma unroll
            for (int n2 = 0; n2 < BC / 16; n2++) {
                uint32_t kb[4];   // keys n2*16 + 0..7 (kb0, kb1) and + 8..15 (kb2, kb3)
                ldsm_x4(kb, &ks[(n2 * 16 + lane % 8 + lane / 16 * 8) * LD + kk * 16 + lane / 8 % 2 * 8]);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const uint32_t *A = QREG ? qf[QREG ? mt : 0][QREG ? kk : 0] : qa[QREG ? 0 : mt];
                    mma16816(s[mt][2 * n2], A, kb[0], kb[1]);
                    mma16816(s[mt][2 * n2 + 1], A, kb[2], kb[3]);
                }
            }
        }

        // mask, scale (base 2), running max; every key of the tile exists and is visible to
        // every row of this warp: no mask
        const bool full = mmg[t].y <= wlo && (t + 1) * BC <= a.len;
        float base[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            softmax_step<HD>(s[mt], kp, qp[mt], full, scale_log2, m[mt], l[mt], o[mt], base[mt], tq);

        // P = 2^(s - m) in bf16 A fragments; O += P V: each V fragment feeds the MT query tiles
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) p_fragment(s[mt], kk, base[mt], l[mt], pa[mt]);
#pragma unroll
            for (int d2 = 0; d2 < HD / 16; d2++) {
                uint32_t vb[4];   // dims d2*16 + 0..7 (vb0, vb1) and + 8..15 (vb2, vb3)
                ldsm_x4_t(vb, &vs[(kk * 16 + lane % 8 + lane / 8 % 2 * 8) * LD + d2 * 16 + lane / 16 * 8]);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(o[mt][2 * d2], pa[mt], vb[0], vb[1]);
                    mma16816(o[mt][2 * d2 + 1], pa[mt], vb[2], vb[3]);
                }
            }
        }
        __syncthreads();   // buffer b is read; the prefetch after next overwrites it
        t = tn;
    }
    cp_async_wait<0>();

#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int rr[2] = {row(mt, 0), row(mt, 1)};
        store_rows<HD>(out, o[mt], l[mt], rr, a, h, tq);
    }
}

// ---- the warpgroup kernel ("wg", sm_90a) -------------------------------------------------------

// The same pass with Hopper's wgmma: a block = WG warpgroups of 64 query rows; a warpgroup's S =
// Q K^T and O += P V are m64nNk16 products whose B operand (K, V) the tensor cores read from
// shared memory once for all 64 rows (fa2w's warps each ldmatrix the whole tile for 32), and
// whose A operand is Q in shared memory (S) or P in registers (O: the S accumulator's layout is
// the A fragment's, as in fa2). Q, K, V sit in shared memory in the no-swizzle canonical layout:
// core matrices of 8 rows x 16 bytes, 128 contiguous bytes each; for Q and K (K-major) core
// matrix (row / 8, dim / 8) at (row / 8) * HD * 16 + (dim / 8) * 128; for V (MN-major: keys
// along K, dims along N) core matrix (dim / 8, key / 8) at (dim / 8) * BC * 16 + (key / 8) * 128.
// Per 64-key tile a warpgroup reads 48 KB of shared memory (Q, K, V once) and the block writes
// 32 KB (K, V) for 4.2 MFLOP: 33 FLOP per shared byte at HD = 128 with WG = 2 (fa2w: 20).
#define WG 2   // warpgroups per block

template <int HD>
struct wg_smem {
    bf16 q[WG * 64 * HD];
    bf16 k[2][BC * HD];
    bf16 v[2][BC * HD];
    int kp[2][BC];
};

// byte offset of the 16-byte row holding (row r, dims c8 * 8 ..) of a K-major tile, and of
// (key j, dims c8 * 8 ..) of a V tile
template <int HD> __device__ static inline int kmaj(int r, int c8) {
    return (r / 8) * HD * 16 + c8 * 128 + (r % 8) * 16;
}
[[maybe_unused]] __device__ static inline int vmaj(int j, int c8) { return c8 * BC * 16 + (j / 8) * 128 + (j % 8) * 16; }

// q (n, heads, HD), K/V (n_kv_head, cap, HD) -> out (n, heads, HD); grid (ceil(n / (64 WG)),
// heads), WG * 128 threads, sizeof(wg_smem<HD>) dynamic shared memory. mm: tile_minmax_kernel's.
// __launch_bounds__(., 2): two blocks (16 warps) per SM; ptxas for sm_90a then holds HD = 128 to
// 128 registers with 36 bytes of spills (157 registers unbounded: one block, 8 warps)
template <int HD>
__global__ void __launch_bounds__(WG * 128, 2)
attn_wg_kernel(bf16 *out, attn_cuda_args a, const int2 *mm, float scale_log2) {
#if SIFT_WGMMA
    SHARED_DYNAMIC(unsigned char, smem_raw);
    typedef wg_smem<HD> smem_t;
    smem_t &sm = *(smem_t *)smem_raw;
    constexpr int CH = HD / 8, ROWS = WG * 64, NT = WG * 128;
    __shared__ int qlo_s[WG * 4], qhi_s[WG * 4];
    const int nqb = gridDim.x, qb = nqb - 1 - blockIdx.x;   // the longest rows start first
    const int h = blockIdx.y, g = h / (a.heads / a.n_kv_head), i0 = qb * ROWS;
    const int tid = threadIdx.x, warp = tid / 32, wg = warp / 4, lane = tid % 32, gr = lane / 4,
              tq = lane % 4;
    const int ntiles = (a.len + BC - 1) / BC;
    const bf16 *q = (const bf16 *)a.q, *kg = (const bf16 *)a.k + (size_t)g * a.cap * HD;
    const bf16 *vg = (const bf16 *)a.v + (size_t)g * a.cap * HD;
    const int2 *mmg = mm + (size_t)g * ntiles;
    unsigned char *qs = (unsigned char *)sm.q;

    // Q tile (rows past n read as zeros); thread e takes row e % 8 of core matrix e / 8 (8
    // threads fill one 128-byte core matrix)
    for (int e = tid; e < ROWS * CH; e += NT) {
        int r = e / (8 * CH) * 8 + e % 8, c8 = e / 8 % CH, i = i0 + r;
        const bf16 *src = q + ((size_t)(i < a.n ? i : 0) * a.heads + h) * HD + c8 * 8;
        cp_async16(qs + kmaj<HD>(r, c8), src, i < a.n);
    }
    // this thread's rows: row(0) and row(1) (8 below), of its warp's 16 in the warpgroup's 64
    auto row = [&](int e) { return i0 + warp * 16 + gr + 8 * e; };
    int qp[2], lo = INT_MAX, hi = INT_MIN;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int i = row(e);
        qp[e] = i < a.n ? a.qpos[i] : INT_MIN;
        if (i < a.n) lo = min(lo, qp[e]);
        hi = max(hi, qp[e]);
    }
    int qmax, wlo;   // every row of this warp sees a key at position <= wlo
    position_bounds(lo, hi, qlo_s, qhi_s, WG * 4, &qmax, &wlo);

    auto load_tile = [&](int t, int b) {
        const int j0 = t * BC;
        unsigned char *ks = (unsigned char *)sm.k[b], *vs = (unsigned char *)sm.v[b];
        for (int e = tid; e < BC * CH; e += NT) {
            int rr = e / (8 * CH) * 8 + e % 8, c8 = e / 8 % CH, j = j0 + rr;
            size_t o = (size_t)(j < a.len ? j : 0) * HD + c8 * 8;
            cp_async16(ks + kmaj<HD>(rr, c8), kg + o, j < a.len);
            cp_async16(vs + vmaj(rr, c8), vg + o, j < a.len);
        }
        if (tid < BC) {
            int j = j0 + tid;
            sm.kp[b][tid] = j < a.len ? a.kpos[(size_t)g * a.cap + j] : INT_MAX;
        }
    };
    auto next_visible = [&](int t) {
        while (t < ntiles && mmg[t].x > qmax) t++;
        return t;
    };

    int t = next_visible(0);
    if (t < ntiles) load_tile(t, 0);
    cp_async_commit();

    // O (64 x HD per warpgroup): the accumulator layout, o[d][0..1] row gr, o[d][2..3] row gr + 8,
    // columns d * 8 + 2 tq + 0..1 (mma.m16n8k16's C per 8 columns)
    float o[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0;

    for (int b = 0; t < ntiles; b ^= 1) {
        int tn = next_visible(t + 1);
        if (tn < ntiles) load_tile(tn, b ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        fence_proxy_async();   // this thread's landed copies (Q, K, V), visible to wgmma
        __syncthreads();
        const int *kp = sm.kp[b];
        // descriptors: LBO 128 (core matrices 8 dims or 8 keys apart along K), SBO the stride
        // between 8-row groups (Q, K: HD * 16 bytes) or 8-dim groups (V: BC * 16)
        const uint64_t dq = wg_desc(qs + kmaj<HD>(wg * 64, 0), 128, HD * 16);
        const uint64_t dk = wg_desc(sm.k[b], 128, HD * 16), dv = wg_desc(sm.v[b], 128, BC * 16);

        // S (64 x BC) = Q K^T, HD / 16 products of K = 16 dims (descriptors advance 2 core
        // matrices = 256 bytes along K)
        float s[BC / 8][4];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_m64n64k16_ss(&s[0][0], dq + (uint64_t)(kk * 256 >> 4), dk + (uint64_t)(kk * 256 >> 4), kk > 0);
        wg_commit();
        wg_wait<0>();
        wg_hold<BC / 2>(&s[0][0]);

        // mask, scale (base 2), running max; P = 2^(s - m) as bf16 A fragments, 16 keys each
        const bool full = mmg[t].y <= wlo && (t + 1) * BC <= a.len;
        float base[2];
        softmax_step<HD>(s, kp, qp, full, scale_log2, m, l, o, base, tq);
        uint32_t pa[BC / 16][4];
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) p_fragment(s, kk, base, l, pa[kk]);

        // O += P V, BC / 16 products of K = 16 keys (V descriptors advance 2 core matrices);
        // O (rescaled) and P were just written by ordinary instructions: held, then the fence
        wg_hold<HD / 2>(&o[0][0]);
        wg_hold_u<BC / 4>(&pa[0][0]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            if constexpr (HD == 128) wgmma_m64n128k16_rs_tb(&o[0][0], pa[kk], dv + (uint64_t)(kk * 256 >> 4), 1);
            else wgmma_m64n64k16_rs_tb(&o[0][0], pa[kk], dv + (uint64_t)(kk * 256 >> 4), 1);
        }
        wg_commit();
        wg_wait<0>();
        wg_hold<HD / 2>(&o[0][0]);
        __syncthreads();   // buffer b is read; the prefetch after next overwrites it
        t = tn;
    }
    cp_async_wait<0>();
    const int rr[2] = {row(0), row(1)};
    store_rows<HD>(out, o, l, rr, a, h, tq);
#else
    __trap();   // built without sm_90a (a CUARCH override): never answer with an empty kernel
#endif
}

// ---- host side --------------------------------------------------------------------------------

size_t attn_fa2_work_floats(const attn_cuda_args *a) {
    size_t tiles = (size_t)(a->len + BC - 1) / BC;
    return tiles * a->n_kv_head * (sizeof(int2) / sizeof(float));
}

template <int HD, int MT>
static void launch(bf16 *out, const attn_cuda_args *a, int2 *mm, cudaStream_t st) {
    size_t smem = sizeof(fa2_smem<HD, MT>);
    static bool configured;   // opt in to > 48 KiB of dynamic shared memory, once per process
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_fa2_kernel<HD, MT>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    const int rows = fa2_smem<HD, MT>::ROWS;
    dim3 grid((unsigned)((a->n + rows - 1) / rows), (unsigned)a->heads);
    CUDA_LAUNCH((attn_fa2_kernel<HD, MT>), grid, NW * 32, smem, st, out, *a, mm,
                1.4426950408889634f / sqrtf((float)HD));
}

int attn_fa2_takes(const attn_cuda_args *a) { return a->hd == 64 || a->hd == 128; }

// The device's properties, read once.
static const cudaDeviceProp *device(void) {
    static cudaDeviceProp p;
    static bool read;
    if (!read) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
        read = true;
    }
    return &p;
}

// wgmma runs on compute capability 9.0 only (the sm_90a code); the emulator runs it anywhere
int attn_wg_takes(const attn_cuda_args *a) {
    const cudaDeviceProp *p = device();
    return (CUDA_EMULATED || (p->major == 9 && p->minor == 0)) && attn_fa2_takes(a);
}

// fa2w's shared memory against what a block may opt in to (SIFT_CUDA_SMEM_OPTIN overrides the
// device's figure: gpu_check runs compute capability 8.6's choice on any device); at head dim 64
// (54.5 KiB) it fits every device sift runs on
int attn_fa2w_fits(const attn_cuda_args *a) {
    const int set = tunables()->cuda_smem_optin;
    const size_t optin = set ? (size_t)set : device()->sharedMemPerBlockOptin;
    return a->hd == 64 || sizeof(fa2_smem<128, 2>) <= optin;
}

template <int HD>
static void launch_wg(bf16 *out, const attn_cuda_args *a, int2 *mm, cudaStream_t st) {
    size_t smem = sizeof(wg_smem<HD>);
    static bool configured;
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_wg_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
        configured = true;
    }
    dim3 grid((unsigned)((a->n + WG * 64 - 1) / (WG * 64)), (unsigned)a->heads);
    CUDA_LAUNCH(attn_wg_kernel<HD>, grid, WG * 128, smem, st, out, *a, mm,
                1.4426950408889634f / sqrtf((float)HD));
}

void attn_fa2_cuda(void *out, const attn_cuda_args *a, int rows_per_warp, float *work,
                   cudaStream_t st) {   // rows_per_warp 16 (head dim 128), 32, 64 (wgmma)
    if (a->n == 0) return;
    int tiles = (a->len + BC - 1) / BC;
    int2 *mm = (int2 *)work;
    if (tiles > 0) {
        CUDA_LAUNCH(tile_minmax_kernel, dim3((unsigned)tiles, (unsigned)a->n_kv_head), BC, 0, st,
                    mm, a->kpos, a->len, a->cap);
    }
    bf16 *o = (bf16 *)out;
    if (rows_per_warp == 64) a->hd == 64 ? launch_wg<64>(o, a, mm, st) : launch_wg<128>(o, a, mm, st);
    else if (rows_per_warp == 32) a->hd == 64 ? launch<64, 2>(o, a, mm, st) : launch<128, 2>(o, a, mm, st);
    else launch<128, 1>(o, a, mm, st);   // fa2: head dim 128 only (attn_fa2w_fits)
}
