// policies/window_score.h — FastKV's token scoring, shared by fastkv and snapkv: the softmax
// attention of the last w prompt rows (the observation window), summed over those rows, pooled
// (max or average) per head over the prefix candidates [0, n-w), then summed per KV group (KV
// eviction) or over all heads (TSP); the top-k-plus-window selection; and the budget arithmetic
// floor(n * rate).
#pragma once
#include "../model/forward.h"

// The smoothing of the summed window scores (strategy_opts.pool, --pool max|avg). Both are the
// FastKV authors' F.max_pool1d / F.avg_pool1d with padding kernel/2 and stride 1: max-pool ignores
// the padding; avg-pool counts it as zeros (count_include_pad), so every output is a sum / kernel.
enum window_pool { WINDOW_POOL_MAX = 0, WINDOW_POOL_AVG = 1 };

// floor(n * rate), multiplied in float so that n times a decimal rate that is an integer gives
// that integer (100 * 0.7 -> 70, where the double product of 0.7f would give 69.99999).
int window_budget(int n, float rate);

// A fixed budget (--kv-len, --tsp-len; 0 = off) must exceed the window it always keeps, as in
// the FastKV authors' code (max_capacity_prompt - window_size > 0). 0, or -1 with a one-line err.
int window_len_check(const char *flag, int len, int w, char *err, size_t errlen);

// probs (w, heads, n): each window row's softmax over the n keys. pooled (heads, n - w):
// s_h[j] = sum over the w rows of probs[r][h][j], j < n - w; pooled[h] = the max- or avg-pool
// (pool, kernel) of s_h over [0, n - w), edges as enum window_pool says.
void window_score_heads(const float *probs, int w, int heads, int n, int kernel,
                        enum window_pool pool, float *pooled);

// out (groups, c): out[g][j] = sum of pooled[h][j] over the heads / groups heads of group g
// (groups = number of KV heads: S_kv; groups = 1: S_tsp, the sum over all heads).
void window_score_groups(const float *pooled, int heads, int groups, int c, float *out);

// idx (groups, k), w <= k <= n: for each group g, the top (k - w) of scores[g] (the c = n - w
// candidates; ties to the lower index) followed by the window n-w .. n-1; ascending.
void window_select(const float *scores, int groups, int n, int w, int k, int *idx);

// pooled (heads, n - w), malloc'd: window_score_heads of layer l's n = s->n entries, from the
// post-RoPE queries q of the last w alive rows (prefill: entry i is alive row i).
float *window_score_layer(fwd_state *s, int l, const void *q, int w, int kernel,
                          enum window_pool pool);

// Layer l keeps, per KV head g, the top (b - w) of S_kv[g] (from pooled) plus the window, in a
// cache of capacity b + n_gen. Needs w <= b <= s->n.
void window_compress(fwd_state *s, int l, const float *pooled, int w, int b, int n_gen);
