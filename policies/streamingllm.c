// policies/streamingllm.c — `streamingllm` (a baseline of specs/fastkv.md): no scoring. Every
// prompt row goes through every layer with full attention; then each layer's cache keeps the
// first 4 tokens (attention sinks) and the most recent B - 4, B = floor(N * R_KV), for decode.
#include <stdio.h>
#include <stdlib.h>

#include "../util/check.h"
#include "policy.h"
#include "window_score.h"

#define SINKS 4

typedef struct {
    int b, n_gen;
} streaming;

static int streaming_after_attention(void *ctx, fwd_state *s, int l, const void *q) {
    (void)q;
    streaming *st = ctx;
    int n = s->n, b = st->b, groups = s->m->cfg.n_kv_head;
    int *idx = xmalloc((size_t)groups * b * sizeof(int));
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < b; j++) idx[g * b + j] = j < SINKS ? j : n - b + j;
    fwd_kv_keep(s, l, idx, b, b + st->n_gen);
    free(idx);
    return 0;
}

static kv_cache *streaming_prefill(model *m, const int *ids, int n, int n_gen,
                                   const strategy_opts *o, float *logits, prefill_info *info,
                                   char *err, size_t errlen) {
    int L = m->cfg.n_layer;
    streaming st = {window_budget(n, o->kv_rate), n_gen};
    if (st.b <= SINKS)
        snprintf(info->note, sizeof info->note,
                 "prompt of %d tokens is too short for streamingllm (budget %d, %d sink tokens): "
                 "ran it without compression", n, st.b, SINKS);
    int *caps = xmalloc((size_t)L * sizeof(int)), *pos = xmalloc((size_t)n * sizeof(int));
    for (int l = 0; l < L; l++) caps[l] = n + n_gen;
    for (int i = 0; i < n; i++) pos[i] = i;
    fwd_hooks hooks = {.ctx = &st, .after_attention = streaming_after_attention};
    int on = st.b > SINKS && st.b < n;   // b >= n: the budget holds every token
    kv_cache *kv = fwd_kv_create(m, caps, err, errlen);
    if (kv) info->rows_done = fwd_run(m, kv, ids, pos, n, on ? &hooks : NULL, logits, 0);
    free(caps);
    free(pos);
    return kv;
}

const strategy strategy_streamingllm = {
    .name = "streamingllm",
    .about = "every layer keeps 4 sink tokens + the most recent KV, no scoring (StreamingLLM)",
    .prefill = streaming_prefill,
};
