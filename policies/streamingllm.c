// policies/streamingllm.c — `streamingllm` (a baseline of specs/fastkv.md): no scoring. Every
// prompt row goes through every layer with full attention; then each layer's cache keeps the
// first 4 tokens (attention sinks) and the most recent B - 4, B = floor(N * R_KV), for decode.
// The kept entries are the same in every layer: made once, in backend memory, before the pass.
#include <stdio.h>
#include <stdlib.h>

#include "../util/check.h"
#include "policy.h"
#include "window_score.h"

#define SINKS 4

typedef struct {
    int b, n_gen;
    int *idx;   // (n_kv_head, b) backend memory: the sinks, then the last b - SINKS entries
} streaming;

static int streaming_after_attention(void *ctx, fwd_state *s, int l, const void *q) {
    (void)q;
    streaming *st = ctx;
    fwd_kv_keep_at(s, l, st->idx, st->b, st->b + st->n_gen);
    return 0;
}

static kv_cache *streaming_prefill(context *cx, const int *ids, int n, int n_gen,
                                   const strategy_opts *o, const strategy_run *run, float *logits,
                                   prefill_info *info, char *err, size_t errlen) {
    (void)run;
    streaming st = {window_budget(n, o->kv_rate), n_gen, NULL};
    if (st.b <= SINKS)
        snprintf(info->note, sizeof info->note,
                 "prompt of %d tokens is too short for streamingllm (budget %d, %d sink tokens): "
                 "ran it without compression", n, st.b, SINKS);
    int on = st.b > SINKS && st.b < n;   // b >= n: the budget holds every token
    const model *m = cx->m;
    int L = m->cfg.n_layer, groups = m->cfg.n_kv_head, *keep = xmalloc((size_t)L * sizeof(int));
    for (int l = 0; l < L; l++) keep[l] = st.b + n_gen;
    if (on) {
        int *idx = xmalloc((size_t)groups * st.b * sizeof(int));
        for (int g = 0; g < groups; g++)
            for (int j = 0; j < st.b; j++) idx[g * st.b + j] = j < SINKS ? j : n - st.b + j;
        st.idx = fwd_scratch(m, (size_t)groups * st.b * sizeof(int));
        fwd_ints_from_host(m, st.idx, idx, (size_t)groups * st.b);
        free(idx);
    }
    fwd_hooks hooks = {.ctx = &st, .after_attention = streaming_after_attention, .keep_caps = keep};
    kv_cache *kv = prefill_run(cx, ids, n, n_gen, NULL, on ? &hooks : NULL, logits, info, err, errlen);
    if (st.idx) fwd_scratch_free(m, st.idx);
    free(keep);
    return kv;
}

// The work: full's prefill, then a cache of the budget per layer.
static void streaming_cost(const cost_shape *sh, const strategy_opts *o, cost_work *w) {
    int b = window_budget((int)sh->n, o->kv_rate);
    cost_full_prefill(sh, w);
    if (b > SINKS && b < sh->n) w->kv_entries = (double)sh->c->n_layer * b;
}

const strategy strategy_streamingllm = {
    .name = "streamingllm",
    .about = "every layer keeps 4 sink tokens + the most recent KV, no scoring (StreamingLLM)",
    .prefill = streaming_prefill,
    .phase = PHASE_PREFILL,
    .compresses_prefix = 1,
    .cost_prefill = streaming_cost,
};
