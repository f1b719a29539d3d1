// policies/fastkv.c — `fastkv` (specs/fastkv.md, arXiv 2502.01068): Token-Selective Propagation
// + GQA-aware KV compression. Every layer scores the prompt by the softmax attention of the last
// w rows (window_score.h) and keeps, per KV head, the top (B_l - w) tokens plus the window.
// Layers 0..L_TSP run on all N rows; after layer L_TSP only T rows go on (the top T - w by the
// layer score plus the window, ascending, at their original positions).
// Rate budgets (the authors' "proportional" mode): T = floor(N * R_TSP); B_l = floor(n_l * R_KV)
// up to L_TSP, floor(T * R_KV / R_TSP) above: ~R_KV of N.
// Fixed budgets (their "constant" mode, both fixed): --kv-len B in every layer, above L_TSP too,
// and --tsp-len T. A layer of n_l <= B tokens keeps them all; no TSP when N <= T.
// [D] Either may be fixed alone: --kv-len with T from R_TSP; --tsp-len with floor(N * R_KV) above
// L_TSP (~R_KV of N, as the rate mode). Their code also skips TSP when N < B (TSP sits inside its
// compression branch); here TSP depends on T only.
#include <stdio.h>
#include <stdlib.h>

#include "../util/check.h"
#include "policy.h"
#include "window_score.h"

typedef struct {
    int tsp_layer, t, w, kernel, n_gen;   // t: rows propagated past the TSP layer
    enum window_pool pool;
    int b_low, b_up;                      // B_l at or below the TSP layer, and above it
    window_buf wb;                        // the scores, in backend memory
} fastkv;

static int tsp_layer_of(int L, const strategy_opts *o) {
    int l = o->tsp_layer >= 0 ? o->tsp_layer : L / 2 - 1;
    return l > 0 ? l : 0;
}
static int tsp_layer(const model *m, const strategy_opts *o) { return tsp_layer_of(m->cfg.n_layer, o); }

// The budgets for a prompt of n tokens on L layers (above), and whether it is long enough to
// compress at all (else it runs full).
static fastkv fastkv_plan(int L, int n, int n_gen, const strategy_opts *o, int *on) {
    int t = o->tsp_len ? o->tsp_len : window_budget(n, o->tsp_rate), n_up = t < n ? t : n;
    int b_up = o->kv_len    ? o->kv_len
               : o->tsp_len ? window_budget(n, o->kv_rate)
                            : window_budget(n_up, o->kv_rate / o->tsp_rate);
    fastkv f = {.tsp_layer = tsp_layer_of(L, o), .t = t, .w = o->window, .kernel = o->pool_kernel,
                .n_gen = n_gen, .pool = (enum window_pool)o->pool,
                .b_low = o->kv_len ? o->kv_len : window_budget(n, o->kv_rate), .b_up = b_up};
    *on = f.t > f.w && f.b_low > f.w;
    return f;
}

// Rows layer l runs (n, or T above the TSP layer) and what its cache keeps of them (0: all).
static int layer_rows(const fastkv *f, int on, int l, int n) { return on && l > f->tsp_layer && f->t < n ? f->t : n; }

// Layer l's budget B_l for n alive rows (n itself when it holds every token).
static int layer_budget(const fastkv *f, int l, int n) {
    int b = l <= f->tsp_layer ? f->b_low : f->b_up;
    return b >= n ? n : b > f->w ? b : f->w;
}

// Token scoring and KV compression (stage A steps 2-3, and stage B): scores layer l, compresses
// its cache to B_l; at the TSP layer the scores stay for the TSP selection.
static int fastkv_after_attention(void *ctx, fwd_state *s, int l, const void *q) {
    fastkv *f = ctx;
    int n = s->n, b = layer_budget(f, l, n);
    int tsp = l == f->tsp_layer && f->t < n;
    if (b >= n && !tsp) return 0;   // the budget holds every token
    window_score_layer(s, l, q, f->w, f->kernel, f->pool, &f->wb);
    if (b < n) window_compress(s, l, &f->wb, f->w, b, f->n_gen);
    return 0;
}

// TSP selection (stage A step 4): after layer L_TSP only the top (T - w) rows by S_tsp (the
// layer's scores summed over all heads) plus the window go on.
static int fastkv_after_layer(void *ctx, fwd_state *s, int l) {
    fastkv *f = ctx;
    if (l != f->tsp_layer || f->t >= s->n) return 0;
    int *idx = xmalloc((size_t)f->t * sizeof(int));
    window_select_rows(s, &f->wb, f->w, f->t, idx);
    fwd_keep_rows(s, idx, f->t);
    free(idx);
    return 0;
}

// The note for a prompt that fits a fixed budget (nothing to cut there); unset otherwise.
static void fits_note(prefill_info *info, int n, const strategy_opts *o) {
    int kv = o->kv_len && n <= o->kv_len, tsp = o->tsp_len && n <= o->tsp_len;
    if (!kv && !tsp) return;
    snprintf(info->note, sizeof info->note, "prompt of %d tokens fits %s%s%s: %s", n,
             kv ? "--kv-len" : "", kv && tsp ? " and " : "", tsp ? "--tsp-len" : "",
             kv && tsp ? "ran it without compression"
             : kv      ? "every layer kept its whole KV"
                       : "every row went through every layer");
}

static kv_cache *fastkv_prefill(context *cx, const int *ids, int n, int n_gen, const strategy_opts *o,
                                const strategy_run *run, float *logits, prefill_info *info,
                                char *err, size_t errlen) {
    model *m = cx->m;
    (void)run;
    int L = m->cfg.n_layer;
    int on;
    fastkv f = fastkv_plan(L, n, n_gen, o, &on);
    fits_note(info, n, o);
    if (!on)
        snprintf(info->note, sizeof info->note,
                 "prompt of %d tokens is too short for fastkv (window %d): ran it without "
                 "compression", n, f.w);
    int *caps = xmalloc((size_t)L * sizeof(int)), *keep = xmalloc((size_t)L * sizeof(int));
    for (int l = 0; l < L; l++) {   // each layer's rows and what it keeps of them
        int rows = layer_rows(&f, on, l, n), b = layer_budget(&f, l, rows);
        caps[l] = rows + n_gen, keep[l] = b < rows ? b + n_gen : 0;
    }
    fwd_hooks hooks = {.ctx = &f, .after_attention = fastkv_after_attention,
                       .after_layer = fastkv_after_layer, .keep_caps = keep};
    if (on) f.wb = window_buf_make(m, n, f.w, f.b_low > f.b_up ? f.b_low : f.b_up, f.t);
    kv_cache *kv = prefill_run(cx, ids, n, n_gen, caps, on ? &hooks : NULL, logits, info, err, errlen);
    window_buf_free(&f.wb);
    free(caps), free(keep);
    return kv;
}

static int fastkv_check(const model *m, const strategy_opts *o, char *err, size_t errlen) {
    int L = m->cfg.n_layer, l = tsp_layer(m, o);
    if (l >= L)
        return err_printf(err, errlen, "--tsp-layer %d is outside this model's %d layers (0..%d)",
                          l, L, L - 1);
    if (window_len_check("--kv-len", o->kv_len, o->window, err, errlen)) return -1;
    return window_len_check("--tsp-len", o->tsp_len, o->window, err, errlen);
}

static void fastkv_resolve(const model *m, const strategy_run *run, strategy_opts *o) {
    (void)run;
    o->tsp_layer = tsp_layer(m, o);
}

// The work: each layer's rows, attention among them and the window rows' scores over them
// (QK^T again: 2 qd per pair), and the cache its budget keeps.
static void fastkv_cost(const cost_shape *sh, const strategy_opts *o, cost_work *w) {
    const model_config *c = sh->c;
    int L = c->n_layer, n = (int)sh->n, on;
    fastkv f = fastkv_plan(L, n, (int)sh->n_gen, o, &on);
    *w = (cost_work){.gemm_flops = cost_lm_head_flops(c)};
    for (int l = 0; l < L; l++) {
        int rows = layer_rows(&f, on, l, n), b = on ? layer_budget(&f, l, rows) : rows;
        cost_add_layers(c, w, 1, rows, cost_causal_pairs(rows));
        if (on) w->attn_flops += cost_attn_flops(c, (double)f.w * rows) / 2;
        w->kv_entries += b;
    }
}

const strategy strategy_fastkv = {
    .name = "fastkv",
    .resolve = fastkv_resolve,
    .about = "token-selective propagation after layer L/2-1 + per-KV-head KV compression (FastKV)",
    .prefill = fastkv_prefill,
    .check = fastkv_check,
    .phase = PHASE_PREFILL,
    .compresses_prefix = 1,
    .cost_prefill = fastkv_cost,
};
