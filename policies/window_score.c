// policies/window_score.c — see window_score.h.
#include "window_score.h"

#include <math.h>
#include <stdlib.h>

#include "../util/check.h"

int window_budget(int n, float rate) { return (int)floorf((float)n * rate); }

int window_len_check(const char *flag, int len, int w, char *err, size_t errlen) {
    if (len == 0 || len > w) return 0;
    return err_printf(err, errlen, "%s %d must exceed --window %d (the window is always kept)",
                      flag, len, w);
}

window_buf window_buf_make(const model *m, int n, int w, int b, int t) {
    size_t c = n > w ? (size_t)(n - w) : 1, k = (size_t)(b > t ? b : t) + 1;
    const model_config *cf = &m->cfg;
    return (window_buf){m, fwd_scratch(m, (size_t)cf->n_head * c * sizeof(float)),
                        fwd_scratch(m, (size_t)cf->n_kv_head * c * sizeof(float)),
                        fwd_scratch(m, (size_t)cf->n_kv_head * k * sizeof(int))};
}

void window_buf_free(window_buf *wb) {
    if (!wb->m) return;
    fwd_scratch_free(wb->m, wb->pooled), fwd_scratch_free(wb->m, wb->group), fwd_scratch_free(wb->m, wb->idx);
    *wb = (window_buf){0};
}

void window_score_layer(fwd_state *s, int l, const void *q, int w, int kernel,
                        enum window_pool pool, window_buf *wb) {
    int n = s->n;
    fwd_window_scores(s, l, q, w, n, n - w, kernel, pool == WINDOW_POOL_AVG, wb->pooled);
}

void window_compress(fwd_state *s, int l, window_buf *wb, int w, int b, int n_gen) {
    int n = s->n, heads = s->m->cfg.n_head, groups = s->m->cfg.n_kv_head, c = n - w;
    CHECK_INTERNAL(w <= b && b <= n, "keep %d of %d tokens with a window of %d", b, n, w);
    fwd_score_group_sum(s->m, wb->group, wb->pooled, heads, groups, c);   // S_kv (groups, c)
    fwd_score_select(s->m, wb->idx, b, wb->group, groups, c, b - w, w);
    fwd_kv_keep_at(s, l, wb->idx, b, b + n_gen);
}

void window_select_rows(fwd_state *s, window_buf *wb, int w, int t, int *rows) {
    int n = s->n, c = n - w;
    CHECK_INTERNAL(w <= t && t <= n, "select %d of %d rows with a window of %d", t, n, w);
    fwd_score_group_sum(s->m, wb->group, wb->pooled, s->m->cfg.n_head, 1, c);   // S_tsp (c,)
    fwd_score_select(s->m, wb->idx, t, wb->group, 1, c, t - w, w);
    fwd_ints_to_host(s->m, rows, wb->idx, (size_t)t);   // the rows that go on: once per prefill
}
