// attn/score_cuda.cu — token scoring on the device; the CPU twins are in score.c.
// Top-k selection (score_topk): one block per row, a radix select finds the k-th largest value
// in four 8-bit passes over the row (a shared 256-bin histogram each), then one ordered pass
// writes every index above it and the lowest-indexed ones equal to it, in ascending order (two
// block scans per tile), then the row's tail indices. The window scores (score_window_pool) and
// group sums (score_group_sum): one thread per output, summing in the CPU twin's order.
#include <cub/block/block_scan.cuh>

#include "../util/cuda_util.cuh"
#include "score_cuda.h"
extern "C" {
#include "score.h"
}

#define TOPK_THREADS 512

// Order-preserving map of a float to an unsigned key (larger float -> larger key).
__device__ static unsigned topk_key(float x) {
    unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

// idx (rows, ld): row r = lo + the top k of s[r * stride + 0 .. n), ascending, then lo + n .. +tail
__global__ void topk_rows_kernel(int *idx, size_t ld, const float *s, size_t stride, int n, int k,
                                 int lo, int tail) {
    typedef cub::BlockScan<int, TOPK_THREADS> scan_t;
    __shared__ typename scan_t::TempStorage scan_tmp;
    __shared__ unsigned hist[256], prefix_s, need_s;
    const float *row = s + blockIdx.x * stride;
    int *out = idx + (size_t)blockIdx.x * ld;
    for (int t = threadIdx.x; t < tail; t += blockDim.x) out[k + t] = lo + n + t;
    if (k == 0) return;
    // the k-th largest key, 8 bits at a time: after each pass `prefix` holds its top bits and
    // `need` how many of the keys sharing them are still to be taken
    unsigned prefix = 0, mask = 0, need = (unsigned)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            unsigned u = topk_key(row[i]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 0xFFu], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {   // the bin holding the need-th largest, counting from the top
            unsigned above = 0;
            int bin = 255;
            for (; bin > 0 && above + hist[bin] < need; bin--) above += hist[bin];
            need_s = need - above;
            prefix_s = prefix | ((unsigned)bin << shift);
        }
        __syncthreads();
        need = need_s, prefix = prefix_s, mask |= 0xFFu << shift;
    }
    // every key above the threshold, and the first `need` equal to it, in index order
    int base = 0, eq_seen = 0;
    for (int t0 = 0; t0 < n; t0 += blockDim.x) {
        int i = t0 + threadIdx.x;
        unsigned u = i < n ? topk_key(row[i]) : 0;
        int eq = i < n && u == prefix, eq_rank, eq_total, pos, total;
        scan_t(scan_tmp).ExclusiveSum(eq, eq_rank, eq_total);
        __syncthreads();
        int take = (i < n && u > prefix) || (eq && eq_seen + eq_rank < (int)need);
        scan_t(scan_tmp).ExclusiveSum(take, pos, total);
        __syncthreads();
        if (take) out[base + pos] = lo + i;
        base += total, eq_seen += eq_total;
    }
}

void score_topk_rows_cuda(int *idx, size_t ld, const float *s, size_t stride, int rows, int n,
                          int k, int lo, int tail, cudaStream_t stream) {
    if (rows == 0 || k + tail == 0) return;
    CUDA_LAUNCH(topk_rows_kernel, rows, TOPK_THREADS, 0, stream, idx, ld, s, stride, n, k, lo, tail);
}

// out (heads, c) from probs (nq, heads, m): thread (h, j) pools s_h over [j - kernel/2, j +
// kernel/2] ∩ [0, c), each s_h[t] the sum of probs[r][h][t] over r in order (score_window_pool)
__global__ void window_pool_kernel(float *out, const float *probs, int nq, int heads, int m, int c,
                                   int kernel, int avg) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)heads * c) return;
    int h = (int)(e / c), j = (int)(e % c), r = kernel / 2;
    int lo = j - r < 0 ? 0 : j - r, hi = j + r >= c ? c - 1 : j + r;
    float mx = 0;
    double sum = 0;
    for (int t = lo; t <= hi; t++) {
        float acc = 0;
        for (int i = 0; i < nq; i++) acc += probs[((size_t)i * heads + h) * m + t];
        if (t == lo || acc > mx) mx = acc;
        sum += acc;
    }
    out[e] = avg ? (float)(sum / kernel) : mx;
}

void score_window_pool_cuda(float *out, const float *probs, int nq, int heads, int m, int c,
                            int kernel, int avg, cudaStream_t stream) {
    size_t total = (size_t)heads * c;
    if (total == 0) return;
    CUDA_LAUNCH(window_pool_kernel, cuda_blocks(total, 256), 256, 0, stream, out, probs, nq, heads,
                m, c, kernel, avg);
}

// row_max, sum (c,): thread j takes the max of row_max[j] and in[h][j] over the heads; at the
// row's last layer adds it to sum[j] and clears row_max[j] (score_fold_max)
__global__ void fold_max_kernel(float *row_max, float *sum, const float *in, int heads, int c,
                                int last) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= (size_t)c) return;
    float m = row_max[j];
    for (int h = 0; h < heads; h++) m = fmaxf(m, in[(size_t)h * c + j]);
    if (last) sum[j] += m, m = 0;
    row_max[j] = m;
}

void score_fold_max_cuda(float *row_max, float *sum, const float *in, int heads, int c, int last,
                         cudaStream_t stream) {
    if (c <= 0) return;
    CUDA_LAUNCH(fold_max_kernel, cuda_blocks((size_t)c, 256), 256, 0, stream, row_max, sum, in,
                heads, c, last);
}

// out (groups, c): thread (g, j) sums in[h][j] over group g's heads in order (score_group_sum)
__global__ void group_sum_kernel(float *out, const float *in, int heads, int groups, int c) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)groups * c) return;
    int g = (int)(e / c), j = (int)(e % c), per = heads / groups;
    float acc = 0;
    for (int h = g * per; h < (g + 1) * per; h++) acc += in[(size_t)h * c + j];
    out[e] = acc;
}

void score_group_sum_cuda(float *out, const float *in, int heads, int groups, int c,
                          cudaStream_t stream) {
    size_t total = (size_t)groups * c;
    if (total == 0) return;
    CUDA_LAUNCH(group_sum_kernel, cuda_blocks(total, 256), 256, 0, stream, out, in, heads, groups, c);
}

// ---- topk's decode selector (backend op attn_topk_step; CPU twins attn/attn.h attn_scores_cpu
// and score_union_count) ----

#define DOTS_WARPS 8

// qs (group, hd) = KV head g's query heads of q (heads, hd), bf16 -> fp32 in shared memory.
__device__ static void group_queries(float *qs, const bf16 *q, int g, int group, int hd) {
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x)
        qs[i] = __bfloat162float(q[(size_t)g * group * hd + i]);
    __syncthreads();
}

// q_h . k_j over a warp, its lanes striding over the head dim; the sum in every lane.
__device__ static float warp_dot(const float *qh, const bf16 *kj, int hd, int lane) {
    float acc = 0;
    for (int i = lane; i < hd; i += 32) acc += qh[i] * __bfloat162float(kj[i]);
    return warp_sum(acc);
}

// out (heads, n): a warp per key j of [lo, lo + n) of KV head blockIdx.x, its lanes striding
// over the head dim, the key's dots with each of the group's query heads (queries in shared,
// group x hd floats) summed across the warp. grid (n_kv, key blocks), block DOTS_WARPS x 32.
__global__ void dots_kernel(float *out, const bf16 *q, const bf16 *k, int cap, int group, int hd,
                            int lo, int n) {
    SHARED_DYNAMIC(float, qs);
    int g = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    group_queries(qs, q, g, group, hd);
    for (int j = blockIdx.y * DOTS_WARPS + warp; j < n; j += gridDim.y * DOTS_WARPS) {
        const bf16 *kj = k + ((size_t)g * cap + lo + j) * hd;
        for (int h = 0; h < group; h++) {
            float acc = warp_dot(qs + h * hd, kj, hd, lane);
            if (lane == 0) out[(size_t)(g * group + h) * n + j] = acc;
        }
    }
}

void score_dots_cuda(float *out, const void *q, const void *k, int cap, int heads, int n_kv,
                     int hd, int lo, int n, cudaStream_t stream) {
    if (n <= 0) return;
    int group = heads / n_kv, blocks = (n + DOTS_WARPS * 4 - 1) / (DOTS_WARPS * 4);   // ~4 keys a warp
    blocks = blocks > 4096 ? 4096 : blocks;
    CUDA_LAUNCH(dots_kernel, dim3(n_kv, blocks), DOTS_WARPS * 32, (size_t)group * hd * sizeof(float),
                stream, out, (const bf16 *)q, (const bf16 *)k, cap, group, hd, lo, n);
}

// ---- the page-bound selector (attn/pages.h; CPU twins pages_build_cpu, attn_page_bounds_cpu
// and kv_cpu.c's select_group) ----

// out (n_kv, n_pages, 2, hd): per page of `size` keys of [lo, lo + n) of KV head blockIdx.x, the
// element-wise minimum and maximum (bf16 in and out: exact). grid (n_kv, pages), a thread an
// element.
__global__ void pages_build_kernel(bf16 *out, const bf16 *k, int cap, int hd, int lo, int n,
                                   int size, int n_pages) {
    int g = blockIdx.x, p = blockIdx.y, j0 = p * size, j1 = j0 + size < n ? j0 + size : n;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        float mn = INFINITY, mx = -INFINITY;
        for (int j = j0; j < j1; j++) {
            float x = __bfloat162float(k[((size_t)g * cap + lo + j) * hd + c]);
            mn = fminf(mn, x), mx = fmaxf(mx, x);
        }
        bf16 *b = out + (((size_t)g * n_pages + p) * 2) * hd;
        b[c] = __float2bfloat16(mn), b[hd + c] = __float2bfloat16(mx);
    }
}

void pages_build_cuda(void *out, const void *k, int cap, int n_kv, int hd, int lo, int n, int size,
                      cudaStream_t stream) {
    int n_pages = n > 0 ? (n + size - 1) / size : 0;
    if (n_pages == 0) return;
    CUDA_LAUNCH(pages_build_kernel, dim3(n_kv, n_pages), hd < 128 ? hd : 128, 0, stream, (bf16 *)out,
                (const bf16 *)k, cap, hd, lo, n, size, n_pages);
}

// out (n_kv, n_pages): a warp per page of KV head blockIdx.x, the largest over the group's
// query heads of sum_c max(q_c lo_c, q_c hi_c). grid (n_kv, page blocks), block DOTS_WARPS x 32.
__global__ void page_bounds_kernel(float *out, const bf16 *q, const bf16 *b, int group, int hd,
                                   int n_pages) {
    SHARED_DYNAMIC(float, qs);
    int g = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    group_queries(qs, q, g, group, hd);
    for (int p = blockIdx.y * DOTS_WARPS + warp; p < n_pages; p += gridDim.y * DOTS_WARPS) {
        const bf16 *lo = b + ((size_t)g * n_pages + p) * 2 * hd, *hi = lo + hd;
        float best = -INFINITY;
        for (int h = 0; h < group; h++) {
            float acc = 0;
            for (int i = lane; i < hd; i += 32) {
                float x = qs[h * hd + i];
                acc += fmaxf(x * __bfloat162float(lo[i]), x * __bfloat162float(hi[i]));
            }
            best = fmaxf(best, warp_sum(acc));
        }
        if (lane == 0) out[(size_t)g * n_pages + p] = best;
    }
}

void score_page_bounds_cuda(float *out, const void *q, const void *bounds, int heads, int n_kv,
                            int hd, int n_pages, cudaStream_t stream) {
    if (n_pages <= 0) return;
    int group = heads / n_kv, blocks = (n_pages + DOTS_WARPS * 4 - 1) / (DOTS_WARPS * 4);
    blocks = blocks > 4096 ? 4096 : blocks;
    CUDA_LAUNCH(page_bounds_kernel, dim3(n_kv, blocks), DOTS_WARPS * 32, (size_t)group * hd * sizeof(float),
                stream, out, (const bf16 *)q, (const bf16 *)bounds, group, hd, n_pages);
}

// The entry (from the mid region's start) of candidate c of KV head g: the (c / size)-th of the
// pages pidx (n_kv, read) picked, element c % size; n or more past the region's end.
__device__ static int page_entry(const int *pidx, int read, int size, int g, int c) {
    return pidx[(size_t)g * read + c / size] * size + c % size;
}

// out (heads, read x size): a warp per candidate of KV head blockIdx.x, its dots with each of
// the group's query heads (dots_kernel's arithmetic); candidates past the region -inf.
__global__ void page_dots_kernel(float *out, const bf16 *q, const bf16 *k, int cap, int group,
                                 int hd, int lo, int n, const int *pidx, int read, int size) {
    SHARED_DYNAMIC(float, qs);
    int g = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, nc = read * size;
    group_queries(qs, q, g, group, hd);
    for (int c = blockIdx.y * DOTS_WARPS + warp; c < nc; c += gridDim.y * DOTS_WARPS) {
        int j = page_entry(pidx, read, size, g, c);
        const bf16 *kj = k + ((size_t)g * cap + lo + j) * hd;
        for (int h = 0; h < group; h++) {   // (j is the warp's: all its lanes or none)
            float acc = j < n ? warp_dot(qs + h * hd, kj, hd, lane) : -INFINITY;
            if (lane == 0) out[(size_t)(g * group + h) * nc + c] = acc;
        }
    }
}

void score_page_dots_cuda(float *out, const void *q, const void *k, int cap, int heads, int n_kv,
                          int hd, int lo, int n, const int *pidx, int read, int size,
                          cudaStream_t stream) {
    int group = heads / n_kv, nc = read * size, blocks = (nc + DOTS_WARPS * 4 - 1) / (DOTS_WARPS * 4);
    if (nc <= 0) return;
    blocks = blocks > 4096 ? 4096 : blocks;
    CUDA_LAUNCH(page_dots_kernel, dim3(n_kv, blocks), DOTS_WARPS * 32, (size_t)group * hd * sizeof(float),
                stream, out, (const bf16 *)q, (const bf16 *)k, cap, group, hd, lo, n, pidx, read, size);
}

// idx (heads, k): candidate positions (ascending) -> entries lo + page_entry (still ascending).
__global__ void page_map_kernel(int *idx, const int *pidx, int group, int k, int lo, int read,
                                int size, int total) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < total) idx[t] = lo + page_entry(pidx, read, size, t / k / group, idx[t]);
}

void score_page_map_cuda(int *idx, const int *pidx, int heads, int n_kv, int k, int lo, int read,
                         int size, cudaStream_t stream) {
    int total = heads * k;
    if (total == 0) return;
    CUDA_LAUNCH(page_map_kernel, cuda_blocks(total, 256), 256, 0, stream, idx, pidx, heads / n_kv, k,
                lo, read, size, total);
}

// stats (4,) += the step's exact reads (score_union_count per KV head + the anchors), entries
// cached, 1, and the selector's bytes sel_bytes less short_bytes for each KV head whose pages
// pidx (n_kv, read) hold the partial last page `last` (pidx NULL: none); one block, the length
// from the device when dlen is given. only_sel: stats[3] alone.
__global__ void union_stats_kernel(double *stats, const int *idx, int n_kv, int group, int k,
                                   int n, int len, const int *dlen, double sel_bytes,
                                   const int *pidx, int read, int last, double short_bytes,
                                   int only_sel) {
    __shared__ int count, shorts;
    if (threadIdx.x == 0) count = 0, shorts = 0;
    __syncthreads();
    int mine = 0, mine_short = 0;
    for (int t = threadIdx.x; !only_sel && t < n_kv * group * k; t += blockDim.x) {
        int list = t / k, first = list - list % group, e = idx[t], seen = 0;
        for (int p = first; p < list && !seen; p++) seen = score_sorted_has(idx + (size_t)p * k, k, e);
        mine += !seen;
    }
    for (int t = threadIdx.x; pidx && t < n_kv * read; t += blockDim.x) mine_short += pidx[t] == last;
    atomicAdd(&count, mine);
    atomicAdd(&shorts, mine_short);
    __syncthreads();
    if (threadIdx.x == 0) {
        stats[3] += sel_bytes - shorts * short_bytes;
        if (only_sel) return;
        int L = dlen ? *dlen : len;
        stats[0] += (double)count + (double)n_kv * (L - n);   // the anchors: sink + tail + decode's
        stats[1] += (double)L * n_kv;
        stats[2] += 1;
    }
}

void score_union_stats_cuda(double *stats, const int *idx, int n_kv, int group, int k, int n,
                            int len, const int *dlen, double sel_bytes, const int *pidx, int read,
                            int last, double short_bytes, int only_sel, cudaStream_t stream) {
    CUDA_LAUNCH(union_stats_kernel, 1, 256, 0, stream, stats, idx, n_kv, group, k, n, len, dlen,
                sel_bytes, pidx, read, last, short_bytes, only_sel);
}
