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
// The page-bound selector (attn/pages.h): out (n_kv, n_pages, 2, hd) bf16 = pages_build_cpu of
// each KV head's keys [lo, lo + n) of k (n_kv, cap, hd), bf16.
void pages_build_cuda(void *out, const void *k, int cap, int n_kv, int hd, int lo, int n, int size,
                      cudaStream_t stream);
// out (n_kv, n_pages) = attn_page_bounds_cpu of each KV head's group of query heads of q
// (heads, hd) against its pages' bounds (n_kv, n_pages, 2, hd), bf16.
void score_page_bounds_cuda(float *out, const void *q, const void *bounds, int heads, int n_kv,
                            int hd, int n_pages, cudaStream_t stream);
// out (heads, read x size) = the raw scores of the entries of the pages pidx (n_kv, read,
// ascending) of the region [lo, lo + n): candidate c is entry lo + pidx[g][c / size] x size +
// c % size, -inf past the region's end.
void score_page_dots_cuda(float *out, const void *q, const void *k, int cap, int heads, int n_kv,
                          int hd, int lo, int n, const int *pidx, int read, int size,
                          cudaStream_t stream);
// idx (heads, k) of candidate positions -> the entries they name (as score_page_dots_cuda's).
void score_page_map_cuda(int *idx, const int *pidx, int heads, int n_kv, int k, int lo, int read,
                         int size, cudaStream_t stream);
// stats (4,) += {score_union_count over each KV head's group of the lists idx (n_kv x group, k)
// + n_kv x (len - n) anchors, len x n_kv, 1, sel_bytes - short_bytes x (the KV heads whose
// pages pidx (n_kv, read) hold page `last`; pidx NULL: none)}; len = *dlen when dlen is not
// NULL; only_sel: stats[3] alone.
void score_union_stats_cuda(double *stats, const int *idx, int n_kv, int group, int k, int n,
                            int len, const int *dlen, double sel_bytes, const int *pidx, int read,
                            int last, double short_bytes, int only_sel, cudaStream_t stream);
