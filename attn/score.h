// attn/score.h — token-score arithmetic on host arrays, for strategies that select tokens:
// pooling along the sequence and top-k selection. Mechanisms only; policies/ decides how to use
// them.
#pragma once

#if defined(__CUDACC__)
#define SCORE_FN __host__ __device__ static inline
#else
#define SCORE_FN static inline
#endif

// out[j] = max of s[t] over t in [j - kernel/2, j + kernel/2] ∩ [0, n)  (padding ignored)
void score_maxpool(const float *s, int n, int kernel, float *out);
// out[j] = (sum of s[t] over t in [j - kernel/2, j + kernel/2] ∩ [0, n)) / kernel
// (zero padding, the count always includes the padding)
void score_avgpool(const float *s, int n, int kernel, float *out);
// idx (k,) = indices of the k largest s[0..n), ties to the lower index, sorted ascending.
// k is clamped to [0, n]; returns the count written.
int score_topk(const float *s, int n, int k, int *idx);

// The window scores of FastKV/SnapKV (the CPU twins of the backend ops window_scores,
// score_group_sum and score_select, backend/backend.h):
// out (heads, c) from probs (nq, heads, m), the softmax rows of nq query rows over m keys: per
// head h, s_h[j] = the sum over the rows r (in order, in float) of probs[r][h][j] for j < c,
// then out[h] = the max-pool (avg 0) or avg-pool (avg 1) of s_h with `kernel` (as above).
void score_window_pool(const float *probs, int nq, int heads, int m, int c, int kernel, int avg,
                       float *out);
// SpecPrefill's fold (the CPU twin of the backend op score_fold_max): row_max (c,) = the max of
// row_max and of in[h][j] over the heads h of in (heads, c); when last (the query row's last
// layer), sum (c,) += row_max and row_max = 0, so that sum holds, over the rows, each row's max
// over (layer, head).
void score_fold_max(const float *in, int heads, int c, float *row_max, float *sum, int last);
// out (groups, c): out[g][j] = the sum of in[h][j] over group g's heads / groups consecutive
// heads (in order, in float).
void score_group_sum(const float *in, int heads, int groups, int c, float *out);
// idx (rows, ld): for each row r of s (rows, c), the top k of its c scores (score_topk: ties to
// the lower index, ascending) followed by c, c + 1, ..., c + tail - 1 (k + tail <= ld).
void score_select(const float *s, int rows, int c, int k, int tail, int *idx, int ld);

// topk's decode selector (backend op attn_topk_step; its scores: attn/attn.h attn_scores_cpu):
// the number of distinct entries in `lists` ascending lists of k entries each, idx (lists, k):
// an entry counts in the first list that holds it.
int score_union_count(const int *idx, int lists, int k);
// Whether e is in the ascending list a (k,): score_union_count's test, the same on the host and
// on the device (attn/score_cuda.cu's count of topk's reads).
SCORE_FN int score_sorted_has(const int *a, int k, int e) {
    int lo = 0, hi = k;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (a[mid] < e) lo = mid + 1;
        else hi = mid;
    }
    return lo < k && a[lo] == e;
}
