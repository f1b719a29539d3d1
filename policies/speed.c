// policies/speed.c — `speed`: Shallow Prefill, dEEp Decode (specs/speed.md). Prompt tokens run
// and are cached only in the first K layers; above K only the anchor (the first prompt token:
// the BOS where a model adds one) and the last prompt token go on, the latter as the first "deep"
// token. Decode tokens run every layer, so in layers >= K they see {anchor, last prompt token,
// earlier decode tokens, themselves}. Positions are never renumbered.
#include "../util/check.h"
#include "policy.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    int depth;     // K: layers that see the whole prompt
    int anchors;   // |A|: 1 (the first prompt token) or 0
} speed_plan;

static int depth_of(int L, const strategy_opts *o) {
    return o->speed_depth > 0 ? o->speed_depth : (7 * L + 7) / 8;   // ceil(0.875 L)
}
static int speed_depth(const model *m, const strategy_opts *o) { return depth_of(m->cfg.n_layer, o); }

// Prefill 2-4: after layer K-1 the prompt stops; only the anchor row and the last row (the first
// output token's) go deep.
static int speed_after_layer(void *ctx, fwd_state *s, int l) {
    const speed_plan *p = ctx;
    if (l != p->depth - 1) return 0;
    int rows[2], k = 0;
    if (p->anchors) rows[k++] = 0;
    rows[k++] = s->n - 1;
    fwd_keep_rows(s, rows, k);
    return 0;
}

static kv_cache *speed_prefill(context *cx, const int *ids, int n, int n_gen, const strategy_opts *o,
                               const strategy_run *run, float *logits, prefill_info *info,
                               char *err, size_t errlen) {
    model *m = cx->m;
    (void)run;
    int L = m->cfg.n_layer;
    // With a one-token prompt the anchor is the last prompt token itself.
    speed_plan p = {.depth = speed_depth(m, o), .anchors = o->anchor && n > 1};
    int *caps = xmalloc((size_t)L * sizeof(int));
    for (int l = 0; l < L; l++) caps[l] = l < p.depth ? n + n_gen : p.anchors + 1 + n_gen;
    fwd_hooks hooks = {.ctx = &p, .after_layer = speed_after_layer};
    kv_cache *kv = prefill_run(cx, ids, n, n_gen, caps, &hooks, logits, info, err, errlen);
    free(caps);
    return kv;
}

static int speed_check(const model *m, const strategy_opts *o, char *err, size_t errlen) {
    if (speed_depth(m, o) <= m->cfg.n_layer) return 0;
    return err_printf(err, errlen, "--speed-depth %d is more than the model's %d layers",
                      o->speed_depth, m->cfg.n_layer);
}

static void speed_resolve(const model *m, const strategy_run *run, strategy_opts *o) {
    (void)run;
    o->speed_depth = speed_depth(m, o);
}

// The work: K layers of n rows; above, the anchor and the last row, which the cache keeps.
static void speed_cost(const cost_shape *sh, const strategy_opts *o, cost_work *w) {
    const model_config *c = sh->c;
    int L = c->n_layer, K = depth_of(L, o) < L ? depth_of(L, o) : L;
    double n = (double)sh->n, deep = (o->anchor && sh->n > 1) + 1;
    *w = (cost_work){.gemm_flops = cost_lm_head_flops(c), .kv_entries = K * n + (L - K) * deep};
    cost_add_layers(c, w, K, n, cost_causal_pairs(n));
    cost_add_layers(c, w, L - K, deep, cost_causal_pairs(deep));
}

const strategy strategy_speed = {
    .name = "speed",
    .resolve = speed_resolve,
    .about = "prompt runs the first K layers only; upper layers see anchor + decode tokens",
    .prefill = speed_prefill,
    .check = speed_check,
    .phase = PHASE_PREFILL,
    .cost_prefill = speed_cost,
};
