// policies/window_score.h — FastKV's token scoring, shared by fastkv and snapkv: the softmax
// attention of the last w prompt rows (the observation window), summed over those rows, pooled
// (max or average) per head over the prefix candidates [0, n-w), then summed per KV group (KV
// eviction) or over all heads (TSP); the top-k-plus-window selection; and the budget arithmetic
// floor(n * rate). The scores and indices stay in backend memory (model/forward.h: token
// scoring; the arithmetic is attn/score.h's): on a GPU nothing per token crosses to the host.
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

// One prefill's scoring buffers in backend memory, made before its pass (window_buf_make: n
// prompt tokens, window w, at most b entries kept per KV head and t rows propagated).
typedef struct window_buf {
    const model *m;
    float *pooled;   // (heads, n - w): the layer's pooled window scores per head
    float *group;    // (n_kv_head, n - w): summed per KV group; its first row: over all heads
    int *idx;        // (n_kv_head, max(b, t)): the kept entries (or rows) per group
} window_buf;
window_buf window_buf_make(const model *m, int n, int w, int b, int t);
void window_buf_free(window_buf *wb);

// wb->pooled (heads, n - w) = the pooled window scores of layer l's n = s->n entries, from the
// post-RoPE queries q of the last w alive rows (prefill: entry i is alive row i).
void window_score_layer(fwd_state *s, int l, const void *q, int w, int kernel,
                        enum window_pool pool, window_buf *wb);

// Layer l keeps, per KV head g, the top (b - w) of S_kv[g] (wb->pooled summed over g's heads;
// ties to the lower index) plus the window, in a cache of capacity b + n_gen. w <= b <= s->n.
void window_compress(fwd_state *s, int l, window_buf *wb, int w, int b, int n_gen);

// rows (t,), host = the TSP selection: the top (t - w) of S_tsp (wb->pooled summed over all
// heads) followed by the window n-w .. n-1, ascending. w <= t <= n = s->n.
void window_select_rows(fwd_state *s, window_buf *wb, int w, int t, int *rows);
