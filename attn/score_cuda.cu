// attn/score_cuda.cu — top-k selection on the device (the CPU twin is score_topk in score.c).
// One block per row: a radix select finds the k-th largest value in four 8-bit passes over the
// row (a shared 256-bin histogram each), then one ordered pass writes every index above it and
// the lowest-indexed ones equal to it, in ascending order (two block scans per tile).
#include <cub/block/block_scan.cuh>

#include "../util/cuda_util.cuh"
#include "score_cuda.h"

#define TOPK_THREADS 512

// Order-preserving map of a float to an unsigned key (larger float -> larger key).
__device__ static unsigned topk_key(float x) {
    unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

__global__ void topk_rows_kernel(int *idx, const float *s, size_t stride, int n, int k, int lo) {
    typedef cub::BlockScan<int, TOPK_THREADS> scan_t;
    __shared__ typename scan_t::TempStorage scan_tmp;
    __shared__ unsigned hist[256], prefix_s, need_s;
    const float *row = s + blockIdx.x * stride;
    int *out = idx + (size_t)blockIdx.x * k;
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

void score_topk_rows_cuda(int *idx, const float *s, size_t stride, int rows, int n, int k, int lo,
                          cudaStream_t stream) {
    if (rows == 0 || k == 0) return;
    CUDA_LAUNCH(topk_rows_kernel, rows, TOPK_THREADS, 0, stream, idx, s, stride, n, k, lo);
}
