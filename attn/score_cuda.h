// attn/score_cuda.h — CUDA twin of score.h's score_topk (score_cuda.cu), for rows of scores
// already on the device. Same rule: the k largest, ties to the lower index, ascending.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>

// idx (rows, k) = lo + the indices of the k largest of each row's s[r * stride + 0 .. n)
// (1 <= k <= n; scores are not NaN). Device pointers; runs on `stream`, no synchronisation.
void score_topk_rows_cuda(int *idx, const float *s, size_t stride, int rows, int n, int k, int lo,
                          cudaStream_t stream);
