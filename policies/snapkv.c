// policies/snapkv.c — `snapkv` (the baseline of specs/fastkv.md): FastKV's scoring and KV
// compression in every layer, no token-selective propagation. Every prompt row goes through every
// layer; after each layer's attention its cache keeps, per KV head, the top (B - w) tokens by the
// window score summed over that head's query group, plus the window. B = floor(N * R_KV), or
// the fixed --kv-len B (the FastKV authors' "constant" mode; a prompt of N <= B keeps everything).
#include <stdio.h>
#include <stdlib.h>

#include "../util/check.h"
#include "policy.h"
#include "window_score.h"

typedef struct {
    int b, w, kernel, n_gen;
    enum window_pool pool;
    window_buf wb;   // the scores, in backend memory
} snapkv;

static int snapkv_after_attention(void *ctx, fwd_state *s, int l, const void *q) {
    snapkv *k = ctx;
    window_score_layer(s, l, q, k->w, k->kernel, k->pool, &k->wb);
    window_compress(s, l, &k->wb, k->w, k->b, k->n_gen);
    return 0;
}

static kv_cache *snapkv_prefill(context *cx, const int *ids, int n, int n_gen, const strategy_opts *o,
                                const strategy_run *run, float *logits, prefill_info *info,
                                char *err, size_t errlen) {
    (void)run;
    snapkv k = {o->kv_len ? o->kv_len : window_budget(n, o->kv_rate), o->window, o->pool_kernel,
                n_gen, (enum window_pool)o->pool, {0}};
    if (o->kv_len && n <= o->kv_len)
        snprintf(info->note, sizeof info->note,
                 "prompt of %d tokens fits --kv-len %d: ran it without compression", n, o->kv_len);
    else if (k.b <= k.w)
        snprintf(info->note, sizeof info->note,
                 "prompt of %d tokens is too short for snapkv (window %d): ran it without "
                 "compression", n, k.w);
    int on = k.b > k.w && k.b < n;   // b >= n: the budget holds every token
    int L = cx->m->cfg.n_layer, *keep = xmalloc((size_t)L * sizeof(int));
    for (int l = 0; l < L; l++) keep[l] = k.b + n_gen;
    fwd_hooks hooks = {.ctx = &k, .after_attention = snapkv_after_attention, .keep_caps = keep};
    if (on) k.wb = window_buf_make(cx->m, n, k.w, k.b, 0);
    kv_cache *kv = prefill_run(cx, ids, n, n_gen, NULL, on ? &hooks : NULL, logits, info, err, errlen);
    window_buf_free(&k.wb);
    free(keep);
    return kv;
}

static int snapkv_check(const model *m, const strategy_opts *o, char *err, size_t errlen) {
    (void)m;
    return window_len_check("--kv-len", o->kv_len, o->window, err, errlen);
}

// The work: full's prefill, the window rows' scores over every row in every layer (QK^T again),
// and a cache of the budget per layer.
static void snapkv_cost(const cost_shape *sh, const strategy_opts *o, cost_work *w) {
    const model_config *c = sh->c;
    int n = (int)sh->n, b = o->kv_len ? o->kv_len : window_budget(n, o->kv_rate);
    cost_full_prefill(sh, w);
    if (b <= o->window || b >= n) return;
    w->attn_flops += c->n_layer * cost_attn_flops(c, (double)o->window * n) / 2;
    w->kv_entries = (double)c->n_layer * b;
}

const strategy strategy_snapkv = {
    .name = "snapkv",
    .about = "every layer keeps its KV per KV head by window attention, no propagation (SnapKV)",
    .prefill = snapkv_prefill,
    .check = snapkv_check,
    .phase = PHASE_PREFILL,
    .compresses_prefix = 1,
    .cost_prefill = snapkv_cost,
};
