// attn/attn_decode_cuda.cu — decode attention (a few query rows over a long cache) by KV group,
// flash-decoding style, for head dims 64, 128 and 256 (CPU twin: attn_causal_cpu in attn_cpu.c;
// attn_cuda.cu's per-head split kernel takes the others):
//  - a block = one (key chunk, KV head g) and up to 16 query vectors of that group (every query
//    head h of g for every row i: 4 per row on Llama 3), so each K/V row is read from memory
//    once per group, not once per query head;
//  - keys in tiles of 32, staged by cp.async (16-byte loads, two buffers) into shared memory rows
//    padded by 16 bytes (each quarter-warp's 16-byte reads of 8 rows hit different banks);
//  - per tile, each warp takes its query vectors in turn: lane j scores key j (the q row is
//    broadcast from shared memory), online softmax across the warp, then lanes over head
//    dimensions (HD / 32 contiguous dims each) accumulate P V;
//  - per chunk partials (max, sum, unnormalised out) in the split kernel's layout, merged by
//    attn_combine_kernel (attn_cuda.cu).
#include <limits.h>
#include <stdint.h>

#include "../util/cuda_util.cuh"
#include "attn_cuda.h"

#define KT 32        // keys per tile
#define NW 4         // warps per block
#define MIN_CHUNK 128   // keys per split at least

// n consecutive bf16 from shared memory (n = 2, 4 or 8: one 4-, 8- or 16-byte load) to fp32
template <int N>
__device__ static inline void load_dims(float *f, const bf16 *p) {
    if constexpr (N == 8) {
        uint4 u = *(const uint4 *)p;
        const __nv_bfloat162 *b = (const __nv_bfloat162 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 x = __bfloat1622float2(b[i]);
            f[2 * i] = x.x, f[2 * i + 1] = x.y;
        }
    } else if constexpr (N == 4) {
        uint2 u = *(const uint2 *)p;
        const __nv_bfloat162 *b = (const __nv_bfloat162 *)&u;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float2 x = __bfloat1622float2(b[i]);
            f[2 * i] = x.x, f[2 * i + 1] = x.y;
        }
    } else {
        float2 x = __bfloat1622float2(*(const __nv_bfloat162 *)p);
        f[0] = x.x, f[1] = x.y;
    }
}

// dot(q (fp32, shared, broadcast), k (bf16 row in shared memory)), 16 bytes of k at a time
template <int HD>
__device__ static inline float dot_row(const float *q, const bf16 *k) {
    float d = 0;
#pragma unroll
    for (int c = 0; c < HD; c += 8) {
        float kf[8];
        load_dims<8>(kf, k + c);
        float4 qa = *(const float4 *)(q + c), qb = *(const float4 *)(q + c + 4);
        d += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3];
        d += qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
    }
    return d;
}

template <int HD, int QVW>
struct group_smem {
    static constexpr int LD = HD + 8;
    bf16 k[2][KT * LD];
    bf16 v[2][KT * LD];
    float q[NW * QVW][HD];
    int kp[2][KT];
};

// Query vector v of a block (blockIdx.z chunk): row i = v / qpg, head h = g * qpg + v % qpg.
// With a.dlen the chunk is derived from the device length (blocks past it write empty partials).
// work[((i * heads + h) * splits + s) * (HD + 2)] = (max, sum, unnormalised out (HD,)).
// grid (splits, n_kv_head, ceil(n * qpg / (NW * QVW))), NW * 32 threads, group_smem dynamic.
// With rows (one cache per query row: a batched decode step), a block serves one row: blockIdx.z
// = row * zr + its share of the row's qpg vectors, and reads that row's cache and length.
template <int HD, int QVW>
__global__ void __launch_bounds__(NW * 32)
attn_group_kernel(float *work, attn_cuda_args a, int chunk, float scale, const attn_cuda_cache *rows) {
    SHARED_DYNAMIC(unsigned char, smem_raw);
    group_smem<HD, QVW> &sm = *(group_smem<HD, QVW> *)smem_raw;
    constexpr int LD = group_smem<HD, QVW>::LD, CH = HD / 8, DPL = HD / 32;
    const int s = blockIdx.x, g = blockIdx.y, splits = gridDim.x;
    const int qpg = a.heads / a.n_kv_head, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int nqv = a.n * qpg, v0 = blockIdx.z * NW * QVW, len = a.len, cap = a.cap;
    const void *kb = a.k, *vb = a.v;
    const int *pb = a.kpos, *dlen = a.dlen;
    if (rows) {   // the block's row and cache: its vectors end where the row's do
        const int zr = (qpg + NW * QVW - 1) / (NW * QVW), r = blockIdx.z / zr;
        v0 = r * qpg + blockIdx.z % zr * NW * QVW, nqv = (r + 1) * qpg;
        const attn_cuda_cache cr = rows[r];
        kb = cr.k, vb = cr.v, pb = cr.kpos, dlen = cr.dlen, len = cr.len, cap = cr.cap;
    }
    if (dlen) len = *dlen;
    if (dlen || rows) {   // the chunk for this length: whole tiles, at least MIN_CHUNK keys
        chunk = ((len + splits - 1) / splits + KT - 1) / KT * KT;
        chunk = max(chunk, (MIN_CHUNK + KT - 1) / KT * KT);
    }
    const int j0 = s * chunk, j1 = min(len, j0 + chunk);
    const bf16 *kg = (const bf16 *)kb + (size_t)g * cap * HD;
    const bf16 *vg = (const bf16 *)vb + (size_t)g * cap * HD;
    const int *pg = pb + (size_t)g * cap;

    auto load_tile = [&](int t0, int b) {
        for (int e = tid; e < KT * CH; e += NW * 32) {
            int r = e / CH, c = e % CH * 8, j = t0 + r;
            size_t o = (size_t)(j < j1 ? j : j0) * HD + c;
            cp_async16(&sm.k[b][r * LD + c], kg + o, j < j1);
            cp_async16(&sm.v[b][r * LD + c], vg + o, j < j1);
        }
        if (tid < KT) sm.kp[b][tid] = t0 + tid < j1 ? pg[t0 + tid] : INT_MAX;
    };
    if (j0 < j1) load_tile(j0, 0);
    cp_async_commit();

    // the block's query vectors, fp32 (zeros past the last)
    for (int e = tid; e < NW * QVW * HD; e += NW * 32) {
        int w = e / HD, c = e % HD, v = v0 + w;
        float x = 0;
        if (v < nqv) {
            int i = v / qpg, h = g * qpg + v % qpg;
            x = __bfloat162float(((const bf16 *)a.q)[((size_t)i * a.heads + h) * HD + c]);
        }
        sm.q[w][c] = x;
    }
    // warp w takes vectors w, w + NW, ...: its softmax state and output dims lane*DPL ..
    int qp[QVW];
    float m[QVW], l[QVW], acc[QVW][DPL];
#pragma unroll
    for (int k = 0; k < QVW; k++) {
        int v = v0 + warp + NW * k;
        qp[k] = v < nqv ? a.qpos[v / qpg] : INT_MIN;
        m[k] = -INFINITY, l[k] = 0;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[k][d] = 0;
    }

    int b = 0;
    for (int t0 = j0; t0 < j1; t0 += KT, b ^= 1) {
        if (t0 + KT < j1) load_tile(t0 + KT, b ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16 *ks = sm.k[b], *vs = sm.v[b];
        const int kpl = sm.kp[b][lane];
#pragma unroll
        for (int k = 0; k < QVW; k++) {
            if (qp[k] == INT_MIN) continue;   // no vector here (warp-uniform)
            float sc = kpl <= qp[k] ? dot_row<HD>(sm.q[warp + NW * k], ks + lane * LD) * scale
                                    : -INFINITY;
            float mt = warp_max(sc);
            if (mt == -INFINITY) continue;    // nothing visible in this tile (warp-uniform)
            float mn = fmaxf(m[k], mt), corr = __expf(m[k] - mn), p = __expf(sc - mn);
            l[k] = l[k] * corr + warp_sum(p);
            m[k] = mn;
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[k][d] *= corr;
#pragma unroll 4
            for (int j = 0; j < KT; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
                float vf[DPL];
                load_dims<DPL>(vf, vs + j * LD + lane * DPL);
#pragma unroll
                for (int d = 0; d < DPL; d++) acc[k][d] += pj * vf[d];
            }
        }
        __syncthreads();   // buffer b is read; the next prefetch overwrites it
    }
    cp_async_wait<0>();

#pragma unroll
    for (int k = 0; k < QVW; k++) {
        int v = v0 + warp + NW * k;
        if (v >= nqv) continue;
        int i = v / qpg, h = g * qpg + v % qpg;
        float *dst = work + (((size_t)i * a.heads + h) * splits + s) * (HD + 2);
        if (lane == 0) dst[0] = m[k], dst[1] = l[k];
#pragma unroll
        for (int d = 0; d < DPL; d++) dst[2 + lane * DPL + d] = acc[k][d];
    }
}

// ---- host side --------------------------------------------------------------------------------

int attn_group_takes(const attn_cuda_args *a) {
    return a->hd == 64 || a->hd == 128 || a->hd == 256;
}

static int qvw_for(const attn_cuda_args *a) {
    int nqv = a->n * (a->heads / a->n_kv_head);
    return nqv <= NW ? 1 : nqv <= 2 * NW ? 2 : 4;
}

// Splits: enough blocks for about eight per multiprocessor (two waves at four resident), each
// chunk at least MIN_CHUNK keys.
int attn_group_splits(const attn_cuda_args *a, int n_sm) {
    int nqv = a->n * (a->heads / a->n_kv_head), z = (nqv + NW * qvw_for(a) - 1) / (NW * qvw_for(a));
    int by_len = (a->len + MIN_CHUNK - 1) / MIN_CHUNK;
    int to_fill = (8 * n_sm + a->n_kv_head * z - 1) / (a->n_kv_head * z);
    int s = by_len < to_fill ? by_len : to_fill;
    return s < 1 ? 1 : s;
}

template <int HD, int QVW>
static void launch(float *work, const attn_cuda_args *a, int splits, cudaStream_t st,
                   const attn_cuda_cache *rows) {
    size_t smem = sizeof(group_smem<HD, QVW>);
    static bool configured;   // > 48 KiB of dynamic shared memory (HD 256): opt in once
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(attn_group_kernel<HD, QVW>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    int nqv = a->n * (a->heads / a->n_kv_head), chunk = (a->len + splits - 1) / splits;
    chunk = (chunk + KT - 1) / KT * KT;   // whole tiles per split (the last may be short)
    int qpg = a->heads / a->n_kv_head, zr = (qpg + NW * QVW - 1) / (NW * QVW);
    unsigned z = rows ? (unsigned)(a->n * zr) : (unsigned)((nqv + NW * QVW - 1) / (NW * QVW));
    dim3 grid((unsigned)splits, (unsigned)a->n_kv_head, z);
    CUDA_LAUNCH((attn_group_kernel<HD, QVW>), grid, NW * 32, smem, st, work, *a,
                chunk < 1 ? KT : chunk, 1.0f / sqrtf((float)HD), rows);
}

template <int HD>
static void launch_hd(float *work, const attn_cuda_args *a, int splits, cudaStream_t st,
                      const attn_cuda_cache *rows) {
    attn_cuda_args one = *a;
    one.n = rows ? 1 : a->n;   // with rows a block serves one row: vectors per block by its qpg
    switch (qvw_for(&one)) {
    case 1: launch<HD, 1>(work, a, splits, st, rows); break;
    case 2: launch<HD, 2>(work, a, splits, st, rows); break;
    default: launch<HD, 4>(work, a, splits, st, rows); break;
    }
}

void attn_group_cuda(float *work, const attn_cuda_args *a, const attn_cuda_cache *rows, int splits,
                     cudaStream_t st) {
    if (a->hd == 64) launch_hd<64>(work, a, splits, st, rows);
    else if (a->hd == 128) launch_hd<128>(work, a, splits, st, rows);
    else launch_hd<256>(work, a, splits, st, rows);
}
