// policies/window_score.c — see window_score.h.
#include "window_score.h"

#include <math.h>
#include <stdlib.h>

#include "../attn/score.h"
#include "../util/check.h"

int window_budget(int n, float rate) { return (int)floorf((float)n * rate); }

int window_len_check(const char *flag, int len, int w, char *err, size_t errlen) {
    if (len == 0 || len > w) return 0;
    return err_printf(err, errlen, "%s %d must exceed --window %d (the window is always kept)",
                      flag, len, w);
}

void window_score_heads(const float *probs, int w, int heads, int n, int kernel,
                        enum window_pool pool, float *pooled) {
    int c = n - w;
    float *sum = xmalloc((size_t)(c > 0 ? c : 1) * sizeof(float));
    for (int h = 0; h < heads; h++) {
        for (int j = 0; j < c; j++) {
            float acc = 0;
            for (int r = 0; r < w; r++) acc += probs[((size_t)r * heads + h) * n + j];
            sum[j] = acc;
        }
        (pool == WINDOW_POOL_AVG ? score_avgpool : score_maxpool)(sum, c, kernel,
                                                                  pooled + (size_t)h * c);
    }
    free(sum);
}

void window_score_groups(const float *pooled, int heads, int groups, int c, float *out) {
    int per = heads / groups;
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < c; j++) {
            float acc = 0;
            for (int h = g * per; h < (g + 1) * per; h++) acc += pooled[(size_t)h * c + j];
            out[(size_t)g * c + j] = acc;
        }
}

void window_select(const float *scores, int groups, int n, int w, int k, int *idx) {
    int c = n - w;
    CHECK_INTERNAL(w <= k && k <= n, "select %d of %d tokens with a window of %d", k, n, w);
    for (int g = 0; g < groups; g++) {
        int *out = idx + (size_t)g * k;
        int top = score_topk(scores + (size_t)g * c, c, k - w, out);
        for (int j = 0; j < w; j++) out[top + j] = c + j;
    }
}

float *window_score_layer(fwd_state *s, int l, const void *q, int w, int kernel,
                          enum window_pool pool) {
    int n = s->n, heads = s->m->cfg.n_head;
    float *probs = xmalloc((size_t)w * heads * n * sizeof(float));
    float *pooled = xmalloc((size_t)heads * (n > w ? n - w : 1) * sizeof(float));
    fwd_attn_probs(s, l, q, w, n, probs);
    window_score_heads(probs, w, heads, n, kernel, pool, pooled);
    free(probs);
    return pooled;
}

void window_compress(fwd_state *s, int l, const float *pooled, int w, int b, int n_gen) {
    int n = s->n, heads = s->m->cfg.n_head, groups = s->m->cfg.n_kv_head, c = n - w;
    float *s_kv = xmalloc((size_t)groups * (c > 0 ? c : 1) * sizeof(float));
    int *idx = xmalloc((size_t)groups * (b > 0 ? b : 1) * sizeof(int));
    window_score_groups(pooled, heads, groups, c, s_kv);
    window_select(s_kv, groups, n, w, b, idx);
    fwd_kv_keep(s, l, idx, b, b + n_gen);
    free(s_kv);
    free(idx);
}
