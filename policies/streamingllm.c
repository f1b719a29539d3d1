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

static kv_cache *streaming_prefill(context *cx, const int *ids, int n, int n_gen,
                                   const strategy_opts *o, const strategy_run *run, float *logits,
                                   prefill_info *info, char *err, size_t errlen) {
    (void)run;
    streaming st = {window_budget(n, o->kv_rate), n_gen};
    if (st.b <= SINKS)
        snprintf(info->note, sizeof info->note,
                 "prompt of %d tokens is too short for streamingllm (budget %d, %d sink tokens): "
                 "ran it without compression", n, st.b, SINKS);
    fwd_hooks hooks = {.ctx = &st, .after_attention = streaming_after_attention};
    int on = st.b > SINKS && st.b < n;   // b >= n: the budget holds every token
    return prefill_run(cx, ids, n, n_gen, NULL, on ? &hooks : NULL, logits, info, err, errlen);
}

const strategy strategy_streamingllm = {
    .name = "streamingllm",
    .about = "every layer keeps 4 sink tokens + the most recent KV, no scoring (StreamingLLM)",
    .prefill = streaming_prefill,
    .phase = PHASE_PREFILL,
};
