// attn/attn_cuda.cu — attention on the GPU (see attn_cuda.h), fp32 softmax and accumulation over
// bf16 q/K/V: the kernel choice (attn_causal_cuda), the kernels for the head dimensions the
// tensor-core ones (attn_prefill_cuda.cu, attn_decode_cuda.cu) do not take, and the probabilities:
//  - flash (prefill, head dims other than 64 and 128): a block = QPB query rows of one head; K/V
//    tiles of 32 keys staged in shared memory; lanes over keys for the scores, lanes over dims for
//    P @ V, online softmax. No n x len matrix.
//  - split (decode, head dims other than 64, 128 and 256): a block = one (query row, head, key
//    chunk) (flash-decoding); warps stride over 32-key tiles; per-chunk partials (max, sum,
//    unnormalised out) merged by the combine kernel (the group kernel's partials too).
//  - probs: a block per (row, head) writes the masked softmax over the first m keys.
#include <limits.h>

#include "../util/cuda_util.cuh"
#include "attn_cuda.h"
extern "C" {
#include "../util/tunables.h"
}

#define TILE 32             // keys per tile = lanes per warp
#define WARPS 4             // warps per block
#define QPW 4               // flash: query rows per warp
#define QPB (WARPS * QPW)   // flash: query rows per block
#define SPLIT_MAX_ROWS 16   // up to this many query rows run split-K
#define SPLIT_MIN_KEYS 256  // split-K: keys per chunk at least

// Folds one tile of 32 keys into a warp's running softmax (m, l) and output acc (dims
// lane + 32 t): s is this lane's key score (-inf when invisible), v(j, c) value c of key j.
template <int DPL, typename ValueFn>
__device__ static inline void online_fold(float &m, float &l, float *acc, float s, int hd,
                                          ValueFn v) {
    float mt = warp_max(s);
    if (mt == -INFINITY) return;   // no visible key in this tile (warp-uniform)
    float mn = fmaxf(m, mt);
    float corr = expf(m - mn);     // m = -inf (nothing yet) -> 0
    float p = expf(s - mn);        // invisible -> 0
    l = l * corr + warp_sum(p);
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int t = 0; t < DPL; t++) acc[t] *= corr;
    for (int j = 0; j < TILE; j++) {
        float pj = __shfl_sync(0xffffffffu, p, j);
        if (pj == 0.0f) continue;  // same for the whole warp
#pragma unroll
        for (int t = 0; t < DPL; t++) {
            int c = lane + 32 * t;
            if (c < hd) acc[t] += pj * v(j, c);
        }
    }
    m = mn;
}

// dot(q[0..hd), k[0..hd)), both bf16 rows in shared memory; hd even.
__device__ static inline float dot_bf16(const bf16 *q, const bf16 *k, int hd) {
    float d = 0;
    for (int c = 0; c < hd; c += 2) {
        float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)(q + c));
        float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)(k + c));
        d += a.x * b.x + a.y * b.y;
    }
    return d;
}

// dot(q, k) with q fp32 (shared) and k a bf16 row of a K buffer; 16-byte loads when hd % 8 == 0
// (rows are then 16-byte aligned: K buffers come from cudaMalloc).
__device__ static inline float dot_f32_bf16(const float *q, const bf16 *k, int hd) {
    float d = 0;
    if (hd % 8 == 0) {
        for (int c = 0; c < hd; c += 8) {
            uint4 u = *(const uint4 *)(k + c);
            const __nv_bfloat162 *p = (const __nv_bfloat162 *)&u;
#pragma unroll
            for (int t = 0; t < 4; t++) {
                float2 b = __bfloat1622float2(p[t]);
                d += q[c + 2 * t] * b.x + q[c + 2 * t + 1] * b.y;
            }
        }
        return d;
    }
    for (int c = 0; c < hd; c += 2) {
        float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)(k + c));
        d += q[c] * b.x + q[c + 1] * b.y;
    }
    return d;
}

// q (n, heads, hd), K/V (n_kv_head, cap, hd) -> out (n, heads, hd); grid (ceil(n/QPB), heads).
// DPL = dims per lane: hd <= 32 * DPL.
template <int DPL>
__global__ void __launch_bounds__(WARPS * 32)
attn_flash_kernel(bf16 *out, attn_cuda_args a, float scale) {
    __shared__ bf16 qs[QPB][DPL * 32];
    __shared__ bf16 ks[TILE][DPL * 32 + 2];   // +2: rows one bank apart, conflict-free reads
    __shared__ bf16 vs[TILE][DPL * 32];
    __shared__ int kp[TILE];
    __shared__ int qmax_s;
    const int hd = a.hd, h = blockIdx.y, g = h / (a.heads / a.n_kv_head);
    const int i0 = blockIdx.x * QPB, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bf16 *q = (const bf16 *)a.q, *k = (const bf16 *)a.k, *v = (const bf16 *)a.v;
    for (int e = threadIdx.x; e < QPB * hd; e += blockDim.x) {
        int r = e / hd, c = e % hd, i = i0 + r;
        qs[r][c] = i < a.n ? q[((size_t)i * a.heads + h) * hd + c] : __float2bfloat16(0.0f);
    }
    if (threadIdx.x == 0) {
        int mx = INT_MIN;
        for (int r = 0; r < QPB && i0 + r < a.n; r++) mx = max(mx, a.qpos[i0 + r]);
        qmax_s = mx;
    }
    __syncthreads();
    const int qmax = qmax_s;
    float m[QPW], l[QPW], acc[QPW][DPL];
    int qp[QPW];
#pragma unroll
    for (int r = 0; r < QPW; r++) {
        int i = i0 + warp * QPW + r;
        m[r] = -INFINITY, l[r] = 0, qp[r] = i < a.n ? a.qpos[i] : INT_MIN;
#pragma unroll
        for (int t = 0; t < DPL; t++) acc[r][t] = 0;
    }
    for (int t0 = 0; t0 < a.len; t0 += TILE) {
        if (threadIdx.x < TILE) {
            int j = t0 + threadIdx.x;
            kp[threadIdx.x] = j < a.len ? a.kpos[(size_t)g * a.cap + j] : INT_MAX;
        }
        if (!__syncthreads_or(threadIdx.x < TILE && kp[threadIdx.x] <= qmax)) continue;
        for (int e = threadIdx.x; e < TILE * hd; e += blockDim.x) {
            int r = e / hd, c = e % hd, j = t0 + r;
            bf16 kz = __float2bfloat16(0.0f), vz = kz;
            if (j < a.len) {
                size_t o = ((size_t)g * a.cap + j) * hd + c;
                kz = k[o], vz = v[o];
            }
            ks[r][c] = kz, vs[r][c] = vz;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < QPW; r++) {
            int qr = warp * QPW + r;
            if (i0 + qr >= a.n) continue;   // warp-uniform
            float s = kp[lane] <= qp[r] ? dot_bf16(qs[qr], ks[lane], hd) * scale : -INFINITY;
            online_fold<DPL>(m[r], l[r], acc[r], s, hd,
                             [&](int j, int c) { return __bfloat162float(vs[j][c]); });
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < QPW; r++) {
        int i = i0 + warp * QPW + r;
        if (i >= a.n) continue;
        float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int t = 0; t < DPL; t++) {
            int c = lane + 32 * t;
            if (c < hd) out[((size_t)i * a.heads + h) * hd + c] = __float2bfloat16(acc[r][t] * inv);
        }
    }
}

// Row i, head h, keys [s*chunk, (s+1)*chunk) -> partial work[((i*heads + h)*splits + s)*(hd+2)]
// = (max, sum, unnormalised out (hd,)); grid (splits, heads, n).
template <int DPL>
__global__ void __launch_bounds__(WARPS * 32)
attn_split_kernel(float *work, attn_cuda_args a, int chunk, float scale) {
    __shared__ float qs[DPL * 32];
    __shared__ float wm[WARPS], wl[WARPS];
    __shared__ float wacc[WARPS][DPL * 32];
    const int s = blockIdx.x, h = blockIdx.y, i = blockIdx.z, splits = gridDim.x, hd = a.hd;
    const int g = h / (a.heads / a.n_kv_head), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bf16 *q = (const bf16 *)a.q + ((size_t)i * a.heads + h) * hd;
    const bf16 *kg = (const bf16 *)a.k + (size_t)g * a.cap * hd;
    const bf16 *vg = (const bf16 *)a.v + (size_t)g * a.cap * hd;
    const int *pg = a.kpos + (size_t)g * a.cap;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) qs[c] = __bfloat162float(q[c]);
    __syncthreads();
    int len = a.len;
    if (a.dlen)   // the chunk for the length at run time, at least SPLIT_MIN_KEYS keys
        len = *a.dlen, chunk = max((len + splits - 1) / splits, SPLIT_MIN_KEYS);
    const int qp = a.qpos[i], j0 = s * chunk, j1 = min(len, j0 + chunk);
    float m = -INFINITY, l = 0, acc[DPL];
#pragma unroll
    for (int t = 0; t < DPL; t++) acc[t] = 0;
    for (int t0 = j0 + warp * TILE; t0 < j1; t0 += WARPS * TILE) {
        int j = t0 + lane;
        float sc = j < j1 && pg[j] <= qp ? dot_f32_bf16(qs, kg + (size_t)j * hd, hd) * scale
                                         : -INFINITY;
        online_fold<DPL>(m, l, acc, sc, hd, [&](int jj, int c) {
            return __bfloat162float(vg[(size_t)(t0 + jj) * hd + c]);
        });
    }
    if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
    for (int t = 0; t < DPL; t++)
        if (lane + 32 * t < hd) wacc[warp][lane + 32 * t] = acc[t];
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < WARPS; w++) mx = fmaxf(mx, wm[w]);
    float *dst = work + (((size_t)i * a.heads + h) * splits + s) * (hd + 2);
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float o = 0;
        for (int w = 0; w < WARPS; w++)
            if (wm[w] != -INFINITY) o += wacc[w][c] * expf(wm[w] - mx);
        dst[2 + c] = o;
    }
    if (threadIdx.x == 0) {
        float sum = 0;
        for (int w = 0; w < WARPS; w++)
            if (wm[w] != -INFINITY) sum += wl[w] * expf(wm[w] - mx);
        dst[0] = mx, dst[1] = sum;
    }
}

// partials (n, heads, splits, hd + 2) -> out (n, heads, hd); grid (heads, n).
__global__ void attn_combine_kernel(bf16 *out, const float *work, int heads, int splits, int hd) {
    const int h = blockIdx.x, i = blockIdx.y, stride = hd + 2;
    const float *p = work + ((size_t)i * heads + h) * splits * stride;
    float mx = -INFINITY, sum = 0;
    for (int s = 0; s < splits; s++) mx = fmaxf(mx, p[s * stride]);
    for (int s = 0; s < splits; s++)
        if (p[s * stride] != -INFINITY) sum += p[s * stride + 1] * expf(p[s * stride] - mx);
    float inv = sum > 0 ? 1.0f / sum : 0.0f;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float o = 0;
        for (int s = 0; s < splits; s++)
            if (p[s * stride] != -INFINITY) o += p[s * stride + 2 + c] * expf(p[s * stride] - mx);
        out[((size_t)i * heads + h) * hd + c] = __float2bfloat16(o * inv);
    }
}

// probs (n, heads, m) = masked softmax of scores; grid (heads, n), blockDim a multiple of 32.
__global__ void attn_probs_kernel(float *probs, attn_cuda_args a, int m, float scale) {
    __shared__ float qs[ATTN_CUDA_MAX_HD];
    __shared__ float red[32];
    const int h = blockIdx.x, i = blockIdx.y, hd = a.hd, g = h / (a.heads / a.n_kv_head);
    const bf16 *q = (const bf16 *)a.q + ((size_t)i * a.heads + h) * hd;
    const bf16 *kg = (const bf16 *)a.k + (size_t)g * a.cap * hd;
    const int *pg = a.kpos + (size_t)g * a.cap, qp = a.qpos[i];
    float *p = probs + ((size_t)i * a.heads + h) * m;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) qs[c] = __bfloat162float(q[c]);
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
        float s = pg[j] <= qp ? dot_f32_bf16(qs, kg + (size_t)j * hd, hd) * scale : -INFINITY;
        p[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_reduce(mx, red, 1);
    float sum = 0;
    for (int j = threadIdx.x; j < m; j += blockDim.x) {   // each thread rereads its own entries
        float e = mx == -INFINITY ? 0.0f : expf(p[j] - mx);
        p[j] = e;
        sum += e;
    }
    sum = block_reduce(sum, red, 0);
    float inv = sum > 0 ? 1.0f / sum : 0.0f;
    for (int j = threadIdx.x; j < m; j += blockDim.x) p[j] *= inv;
}

// ---- host side ------------------------------------------------------------------------------

static int split_count(const attn_cuda_args *a, int n_sm) {
    int by_len = (a->len + SPLIT_MIN_KEYS - 1) / SPLIT_MIN_KEYS;
    int rows = a->n * a->heads;
    int to_fill = (4 * n_sm + rows - 1) / rows;   // about four blocks per multiprocessor
    int s = by_len < to_fill ? by_len : to_fill;
    return s < 1 ? 1 : s;
}

enum kernel { K_FA2, K_FA2W, K_WG, K_FLASH, K_GROUP, K_SPLIT };

// The kernel for a (see attn_cuda.h): decode rows by the group kernel where it takes the head
// dimension, else split; prefill at head dims 64 and 128 by fa2w (fa2 where fa2w's shared memory
// does not fit the device), or wg with SIFT_ATTN_PREFILL=wg on compute capability 9.0; any other
// head dimension by flash.
static enum kernel pick(const attn_cuda_args *a) {
    if (a->n <= SPLIT_MAX_ROWS) return attn_group_takes(a) ? K_GROUP : K_SPLIT;
    if (!attn_fa2_takes(a)) return K_FLASH;
    if (tunables()->attn_prefill == TUN_ATTN_WG && attn_wg_takes(a)) return K_WG;
    return attn_fa2w_fits(a) ? K_FA2W : K_FA2;
}

size_t attn_cuda_work_floats(const attn_cuda_args *a, int n_sm) {
    switch (pick(a)) {
    case K_FA2:
    case K_FA2W:
    case K_WG: return attn_fa2_work_floats(a);
    case K_GROUP: return (size_t)a->n * a->heads * attn_group_splits(a, n_sm) * (a->hd + 2);
    case K_SPLIT: return (size_t)a->n * a->heads * split_count(a, n_sm) * (a->hd + 2);
    default: return 0;
    }
}

static void check_args(const attn_cuda_args *a) {
    if (a->hd < 2 || a->hd > ATTN_CUDA_MAX_HD || a->hd % 2 || a->n_kv_head < 1 ||
        a->heads % a->n_kv_head) {
        fprintf(stderr, "sift: internal error at %s:%d: CUDA attention takes an even head "
                "dimension in [2, %d] and heads a multiple of KV heads (got hd %d, %d/%d heads)\n",
                __FILE__, __LINE__, ATTN_CUDA_MAX_HD, a->hd, a->heads, a->n_kv_head);
        exit(3);
    }
}

static void launch_combine(bf16 *out, const attn_cuda_args *a, const float *work, int splits,
                           cudaStream_t st) {
    CUDA_LAUNCH(attn_combine_kernel, dim3((unsigned)a->heads, (unsigned)a->n), 128, 0, st, out,
                work, a->heads, splits, a->hd);
}

template <int DPL>
static void launch_causal(bf16 *out, const attn_cuda_args *a, float *work, int n_sm,
                          int split, cudaStream_t st) {
    float scale = 1.0f / sqrtf((float)a->hd);
    if (!split) {
        dim3 grid((unsigned)((a->n + QPB - 1) / QPB), (unsigned)a->heads);
        CUDA_LAUNCH(attn_flash_kernel<DPL>, grid, WARPS * 32, 0, st, out, *a, scale);
        return;
    }
    int splits = split_count(a, n_sm);
    int chunk = (a->len + splits - 1) / splits;
    if (chunk < 1) chunk = 1;
    dim3 grid((unsigned)splits, (unsigned)a->heads, (unsigned)a->n);
    CUDA_LAUNCH(attn_split_kernel<DPL>, grid, WARPS * 32, 0, st, work, *a, chunk, scale);
    launch_combine(out, a, work, splits, st);
}

void attn_causal_cuda(void *out, const attn_cuda_args *a, float *work, int n_sm,
                      cudaStream_t st) {
    check_args(a);
    if (a->n == 0) return;
    bf16 *o = (bf16 *)out;
    enum kernel k = pick(a);
    if (a->dlen && k != K_GROUP && k != K_SPLIT) {
        fprintf(stderr, "sift: internal error at %s:%d: a device length for %d query rows (the "
                "decode kernels take up to %d)\n", __FILE__, __LINE__, a->n, SPLIT_MAX_ROWS);
        exit(3);
    }
    int split = k == K_SPLIT;
    if (k == K_FA2 || k == K_FA2W || k == K_WG)
        attn_fa2_cuda(o, a, k == K_WG ? 64 : k == K_FA2W ? 32 : 16, work, st);
    else if (k == K_GROUP) {
        int splits = attn_group_splits(a, n_sm);
        attn_group_cuda(work, a, NULL, splits, st);
        launch_combine(o, a, work, splits, st);
    } else if (a->hd <= 64) launch_causal<2>(o, a, work, n_sm, split, st);
    else if (a->hd <= 128) launch_causal<4>(o, a, work, n_sm, split, st);
    else launch_causal<8>(o, a, work, n_sm, split, st);
}

int attn_decode_multi_takes(const attn_cuda_args *a) {
    attn_cuda_args one = *a;   // each row is a decode row of its own sequence
    one.n = 1;
    return pick(&one) == K_GROUP;
}

size_t attn_decode_multi_work_floats(const attn_cuda_args *a, int n_sm) {
    return (size_t)a->n * a->heads * attn_group_splits(a, n_sm) * (a->hd + 2);
}

void attn_decode_multi_cuda(void *out, const attn_cuda_args *a, const attn_cuda_cache *rows,
                            float *work, int n_sm, cudaStream_t st) {
    check_args(a);
    if (a->n == 0) return;
    if (!attn_decode_multi_takes(a)) {
        fprintf(stderr, "sift: internal error at %s:%d: batched decode attention takes the group "
                "kernel's head dims (64, 128, 256), not %d\n", __FILE__, __LINE__, a->hd);
        exit(3);
    }
    int splits = attn_group_splits(a, n_sm);
    attn_group_cuda(work, a, rows, splits, st);
    launch_combine((bf16 *)out, a, work, splits, st);
}

void attn_probs_cuda(float *probs, const attn_cuda_args *a, int m, cudaStream_t st) {
    check_args(a);
    if (a->dlen) {
        fprintf(stderr, "sift: internal error at %s:%d: attention probabilities read the host "
                "length\n", __FILE__, __LINE__);
        exit(3);
    }
    if (a->n == 0 || m == 0) return;
    CUDA_LAUNCH(attn_probs_kernel, dim3((unsigned)a->heads, (unsigned)a->n), 256, 0, st, probs, *a,
                m, 1.0f / sqrtf((float)a->hd));
}
