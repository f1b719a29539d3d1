// attn/score_cuda.h — CUDA twins of score.h (score_cuda.cu), for scores already on the device.
// Device pointers; each runs on `stream`, no synchronisation.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>

// idx (rows, ld): row r = lo + the indices of the k largest of s[r * stride + 0 .. n) (score_topk:
// ties to the lower index, ascending; 0 <= k <= n, scores not NaN), then lo + n .. lo + n + tail - 1
// (score_select's tail; k + tail <= ld).
void score_topk_rows_cuda(int *idx, size_t ld, const float *s, size_t stride, int rows, int n,
                          int k, int lo, int tail, cudaStream_t stream);
// score_window_pool: out (heads, c) from probs (nq, heads, m)
void score_window_pool_cuda(float *out, const float *probs, int nq, int heads, int m, int c,
                            int kernel, int avg, cudaStream_t stream);
// score_fold_max: row_max, sum (c,) folded with in (heads, c)
void score_fold_max_cuda(float *row_max, float *sum, const float *in, int heads, int c, int last,
                         cudaStream_t stream);
// score_group_sum: out (groups, c) from in (heads, c)
void score_group_sum_cuda(float *out, const float *in, int heads, int groups, int c,
                          cudaStream_t stream);
// topk's selector: out (heads, n) = the raw scores (attn/attn.h attn_scores_cpu) of each query
// head of q (heads, hd) against the keys [lo, lo + n) of its KV head in k (n_kv, cap, hd), bf16
void score_dots_cuda(float *out, const void *q, const void *k, int cap, int heads, int n_kv,
                     int hd, int lo, int n, cudaStream_t stream);
// stats (3,) += {score_union_count over each KV head's group of the lists idx (n_kv x group, k)
// + n_kv x (len - n) anchors, len x n_kv, 1}; len = *dlen when dlen is not NULL
void score_union_stats_cuda(double *stats, const int *idx, int n_kv, int group, int k, int n,
                            int len, const int *dlen, cudaStream_t stream);
