// policies/swiftkv.c — `swiftkv`: SingleInputKV + AcrossKV (specs/swiftkv.md). The residual
// stream entering layer l gives, through one norm and one K/V projection per group of G layers,
// the K/V of every layer l..L-1 (all layers of a group read the group leader's cache). Prefill:
// prompt tokens stop after layer l-1 except the last, which goes on with the query projections
// Q'. Decode: layers < l normally, then the group K/V from that same stream, then Q' layers.
//
// Weights (the plan: built once per model and options, kept with the model): a distilled
// checkpoint (HF config model_type "llama_swiftkv": num_key_value_layers, key_value_group_size,
// tensors model.norm_swiftkv and *_proj_swiftkv), or, on any other model, the training-free
// init (experimental): Q' = Q; a group's K'/V' = the mean of its layers' K/V weights, applied as
// the sum of each layer's projection of x normed with gamma / G, where gamma is layer l's input
// norm (the paper's code; the default: measured better at l = L/2, see bench/EVAL.md) or, folded
// ("own"), each layer's own input norm (so a layer's K/V equal the original whenever its input
// equals layer l's; measured better at l = 3L/4).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "policy.h"

#define CHECKPOINT_TYPE "llama_swiftkv"

typedef struct swiftkv_plan {
    int l, G, L, fold;
    fwd_kv_term *terms;         // [(L - l)] : G terms per group, in group order
    int terms_per_group;        // G (training-free) or 1 (checkpoint)
    const bk_weight **wq, **bq; // [L] query projections Q' of layers >= l
    bk_weight **owned;          // derived vectors to free
    int n_owned;
    model *m;
    struct swiftkv_plan *next;  // the model's other plans (other l, G or norm)
} swiftkv_plan;

static int is_checkpoint(const model *m) {
    const char *type = model_config_str(m, "model_type");
    return type && strcmp(type, CHECKPOINT_TYPE) == 0;
}

// l and G for this model: the checkpoint's (flags may only repeat them), else the flags or
// L/2 and 1. 0 or -1 + err.
static int swiftkv_shape(const model *m, const strategy_opts *o, int *l, int *G, char *err,
                         size_t errlen) {
    int L = m->cfg.n_layer;
    *l = o->swiftkv_layers ? o->swiftkv_layers : L / 2;
    *G = o->swiftkv_group ? o->swiftkv_group : 1;
    if (is_checkpoint(m)) {
        long long cl = 0, cg = 1;
        if (model_config_int(m, "num_key_value_layers", &cl) != 0 ||
            model_config_int(m, "key_value_group_size", &cg) < 0)
            return err_printf(err, errlen, CHECKPOINT_TYPE " config.json needs integer "
                              "num_key_value_layers (and key_value_group_size)");
        if (cl < 1 || cl > L || cg < 1 || cg > L)
            return err_printf(err, errlen, CHECKPOINT_TYPE " config.json: num_key_value_layers "
                              "%lld or key_value_group_size %lld is outside [1, %d]", cl, cg, L);
        if ((o->swiftkv_layers && o->swiftkv_layers != cl) ||
            (o->swiftkv_group && o->swiftkv_group != cg))
            return err_printf(err, errlen, "the checkpoint was distilled for --swiftkv-layers "
                              "%lld --swiftkv-group %lld; other values need a stock model", cl, cg);
        *l = (int)cl;
        *G = (int)cg;
    }
    if (*l < 1 || *l > L)
        return err_printf(err, errlen, "--swiftkv-layers %d is outside [1, %d] (the model's "
                          "layers)", *l, L);
    if (*G < 1 || (L - *l) % *G)
        return err_printf(err, errlen, "--swiftkv-group %d does not divide the %d SwiftKV layers "
                          "(L - l = %d - %d)", *G, L - *l, L, *l);
    return 0;
}

// Checkpoint format: tensor `name` (a printf format of the layer j) of the expected shape (rows
// 0: a vector), or NULL (+ err when required or of another shape).
static const bk_weight *extra(const model *m, const char *name, int j, size_t rows, size_t cols,
                              int required, char *err, size_t errlen) {
    char full[128];
    snprintf(full, sizeof full, name, j);
    const model_extra *e = model_find_extra(m, full);
    if (e && e->rows == rows && e->cols == cols) return e->w;
    if (e || required)
        err_printf(err, errlen, CHECKPOINT_TYPE " checkpoint: tensor '%s' is %s (expected [%zu, "
                   "%zu])", full, e ? "of another shape" : "missing", rows, cols);
    return NULL;
}

#define ATTN "model.layers.%d.self_attn."

// Checkpoint format: layer j >= l's Q' and, for a group leader, the group's K/V projection.
static int plan_checkpoint_layer(swiftkv_plan *p, int j, const bk_weight *norm, char *err,
                                 size_t errlen) {
    const model *m = p->m;
    const model_config *c = &m->cfg;
    size_t d = c->d_model, qd = (size_t)c->n_head * c->head_dim,
           kvd = (size_t)c->n_kv_head * c->head_dim;
    if (!(p->wq[j] = extra(m, ATTN "q_proj_swiftkv.weight", j, qd, d, 1, err, errlen))) return -1;
    p->bq[j] = extra(m, ATTN "q_proj_swiftkv.bias", j, 0, qd, 0, err, errlen);
    if ((j - p->l) % p->G) return 0;
    fwd_kv_term *t = &p->terms[(j - p->l) / p->G];
    t->norm = norm;
    t->wk = extra(m, ATTN "k_proj_swiftkv.weight", j, kvd, d, 1, err, errlen);
    t->wv = t->wk ? extra(m, ATTN "v_proj_swiftkv.weight", j, kvd, d, 1, err, errlen) : NULL;
    if (!t->wv) return -1;
    if (!c->qkv_bias) return 0;
    t->bk = extra(m, ATTN "k_proj_swiftkv.bias", j, 0, kvd, 1, err, errlen);
    t->bv = t->bk ? extra(m, ATTN "v_proj_swiftkv.bias", j, 0, kvd, 1, err, errlen) : NULL;
    return t->bv ? 0 : -1;
}

static int plan_checkpoint(swiftkv_plan *p, char *err, size_t errlen) {
    const bk_weight *norm =
        extra(p->m, "model.norm_swiftkv.weight", 0, 0, p->m->cfg.d_model, 1, err, errlen);
    if (!norm) return -1;
    p->terms_per_group = 1;
    for (int j = p->l; j < p->L; j++)
        if (plan_checkpoint_layer(p, j, norm, err, errlen) != 0) return -1;
    return 0;
}

static bk_weight *own(swiftkv_plan *p, bk_weight *w) {
    p->owned[p->n_owned++] = w;
    return w;
}

// Training-free mode: group g's mean bias of kind `which` (bk or bv), or NULL when the model
// has none.
static const bk_weight *mean_bias(swiftkv_plan *p, int first, int which) {
    const model_config *c = &p->m->cfg;
    if (!c->qkv_bias) return NULL;
    const bk_weight *b[MODEL_MAX_LAYERS];
    for (int i = 0; i < p->G; i++)
        b[i] = which ? p->m->layers[first + i].bv : p->m->layers[first + i].bk;
    return own(p, fwd_vector_sum(p->m, b, p->G, c->n_kv_head * c->head_dim, 1.0f / p->G));
}

// Training-free mode: Q' = Q; K'_g, V'_g = the mean of the group's K/V weights (one term per
// layer, normed with gamma / G); norm_swiftkv = layer l's input norm, or each layer's own (fold).
static void plan_training_free(swiftkv_plan *p) {
    const model *m = p->m;
    int d = m->cfg.d_model;
    p->terms_per_group = p->G;
    if (p->l == p->L) return;   // no SwiftKV layers
    const bk_weight *gamma_l = m->layers[p->l].attn_norm, *shared = NULL;
    if (!p->fold) shared = own(p, fwd_vector_sum(p->m, &gamma_l, 1, d, 1.0f / p->G));
    for (int j = p->l; j < p->L; j++) {
        const layer_weights *w = &m->layers[j];
        const bk_weight *gamma_j = w->attn_norm;
        int first = j - (j - p->l) % p->G;
        fwd_kv_term *t = &p->terms[j - p->l];
        t->norm = p->fold ? own(p, fwd_vector_sum(p->m, &gamma_j, 1, d, 1.0f / p->G)) : shared;
        t->wk = w->wk;
        t->wv = w->wv;
        t->bk = j == first ? mean_bias(p, first, 0) : NULL;
        t->bv = j == first ? mean_bias(p, first, 1) : NULL;
        p->wq[j] = w->wq;
        p->bq[j] = w->bq;
    }
}

static const char plans_kind = 0;   // model_derived's tag of swiftkv's plans

static void plans_free(void *first) {   // the model's plans (model_derived_put)
    for (swiftkv_plan *p = first, *next; p; p = next) {
        next = p->next;
        for (int i = 0; i < p->n_owned; i++) fwd_weight_free(p->m, p->owned[i]);
        free(p->owned);
        free(p->terms);
        free(p->wq);
        free(p->bq);
        free(p);
    }
}

// The plan for o on m: built on first use (the options check at load) and kept with the model
// (model_derived), so no prompt builds it again. NULL + err when o or the checkpoint is wrong.
static const swiftkv_plan *plan_for(model *m, const strategy_opts *o, char *err, size_t errlen) {
    int l, G, fold = !is_checkpoint(m) && o->swiftkv_fold == 1;
    if (swiftkv_shape(m, o, &l, &G, err, errlen) != 0) return NULL;
    swiftkv_plan *first = model_derived_get(m, &plans_kind);
    for (const swiftkv_plan *p = first; p; p = p->next)
        if (p->l == l && p->G == G && p->fold == fold) return p;
    swiftkv_plan *p = xcalloc(1, sizeof *p);
    int L = m->cfg.n_layer;
    *p = (swiftkv_plan){.l = l, .G = G, .L = L, .fold = fold, .m = m,
                        .terms = xcalloc((size_t)(L - l + 1), sizeof *p->terms),
                        .wq = xcalloc((size_t)L, sizeof *p->wq),
                        .bq = xcalloc((size_t)L, sizeof *p->bq),
                        .owned = xcalloc((size_t)(3 * L + 1), sizeof *p->owned)};
    if (!is_checkpoint(m)) plan_training_free(p);
    else if (plan_checkpoint(p, err, errlen) != 0) {
        plans_free(p);
        return NULL;
    }
    if (first) p->next = first->next, first->next = p;   // the list the model keeps, its head kept
    else model_derived_put(m, &plans_kind, p, plans_free);
    return p;
}

// KV for SwiftKV layers: after layer l-1, every alive row's group K/V from the stream entering
// layer l; in prefill only the last row goes on.
static int swiftkv_after_layer(void *ctx, fwd_state *s, int l) {
    const swiftkv_plan *p = ctx;
    if (l != p->l - 1 || p->l == p->L) return 0;
    int n_groups = (p->L - p->l) / p->G;
    for (int g = 0; g < n_groups; g++)
        fwd_kv_from_stream(s, p->l + g * p->G, &p->terms[g * p->terms_per_group],
                           p->terms_per_group);
    if (s->n > 1) {
        int last = s->n - 1;
        fwd_keep_rows(s, &last, 1);
    }
    return 0;
}

// Decode (and the last prompt token): layers >= l read their group leader's cache with Q'.
static int swiftkv_kv_source(void *ctx, int l, int *kv_layer, const bk_weight **wq,
                             const bk_weight **bq) {
    const swiftkv_plan *p = ctx;
    if (l < p->l) return 0;
    *kv_layer = l - (l - p->l) % p->G;
    *wq = p->wq[l];
    *bq = p->bq[l];
    return 1;
}

// Prefill: layers < l keep every prompt token; a group leader's cache holds the group's K/V.
static kv_cache *swiftkv_prefill(context *cx, const int *ids, int n, int n_gen, const strategy_opts *o,
                                 const strategy_run *run, float *logits, prefill_info *info,
                                 char *err, size_t errlen) {
    model *m = cx->m;
    (void)run;
    const swiftkv_plan *p = plan_for(m, o, err, errlen);
    if (!p) return NULL;
    int *caps = xmalloc((size_t)p->L * sizeof(int));
    for (int j = 0; j < p->L; j++)
        caps[j] = j < p->l || (j - p->l) % p->G == 0 ? n + n_gen : 0;   // non-leaders: none
    // recordable: a decode step's group K/V are device products appended to the leaders' caches,
    // and kv_source's answers are the plan's: the same launches every step (a CUDA graph)
    fwd_hooks hooks = {.ctx = (void *)p, .after_layer = swiftkv_after_layer,
                       .kv_source = swiftkv_kv_source, .recordable = 1};
    kv_cache *kv = prefill_run(cx, ids, n, n_gen, caps, &hooks, logits, info, err, errlen);
    free(caps);
    if (!kv) return NULL;
    info->decode = hooks;
    if (!is_checkpoint(m))
        snprintf(info->note, sizeof info->note, "training-free init (l = %d, G = %d), experimental: "
                 "no distilled checkpoint, fidelity in bench/EVAL.md", p->l, p->G);
    return kv;
}

static int swiftkv_check(const model *m, const strategy_opts *o, char *err, size_t errlen) {
    int l, G;
    if (swiftkv_shape(m, o, &l, &G, err, errlen) != 0) return -1;
    int missing = model_qkv_missing_from(m);
    if (!is_checkpoint(m) && missing >= 0)
        return err_printf(err, errlen, "layer %d has no q/k/v projections", missing);
    if (missing >= 0 && missing < l)
        return err_printf(err, errlen, "layer %d < num_key_value_layers %d has no q/k/v "
                          "projections", missing, l);
    // The plan, built once here before any prompt runs (the checkpoint's own tensors checked).
    return plan_for((model *)m, o, err, errlen) ? 0 : -1;
}

// l and G as they run (a checkpoint's own); the norm: shared unless own was asked (a checkpoint
// folds none: its K/V weights are distilled).
static void swiftkv_resolve(const model *m, const strategy_run *run, strategy_opts *o) {
    (void)run;
    int l, G;
    char err[256];
    if (swiftkv_shape(m, o, &l, &G, err, sizeof err) == 0) o->swiftkv_layers = l, o->swiftkv_group = G;
    o->swiftkv_fold = !is_checkpoint(m) && o->swiftkv_fold == 1;
}

// The work (the training-free init: each SwiftKV layer's own K/V projection of the stream): l
// layers of n rows; every row's K and V for the L - l layers above; the last row through those
// layers over n keys. The cache holds n entries a layer (a group's layers read their leader's).
static void swiftkv_cost(const cost_shape *sh, const strategy_opts *o, cost_work *w) {
    const model_config *c = sh->c;
    int L = c->n_layer, l = o->swiftkv_layers ? o->swiftkv_layers : L / 2;
    double n = (double)sh->n;
    l = l < L ? l : L;
    *w = (cost_work){.gemm_flops = cost_lm_head_flops(c) + (L - l) * n * cost_kv_proj_flops(c),
                     .kv_entries = L * n};
    cost_add_layers(c, w, l, n, cost_causal_pairs(n));
    cost_add_layers(c, w, L - l, 1, n);
}

const strategy strategy_swiftkv = {
    .name = "swiftkv",
    .resolve = swiftkv_resolve,
    .about = "upper layers' prompt KV from one hidden state; the prompt skips them "
             "(distilled checkpoint; training-free on other models is experimental)",
    .prefill = swiftkv_prefill,
    .check = swiftkv_check,
    .supplies_qkv = 1,
    .phase = PHASE_PREFILL,
    .cost_prefill = swiftkv_cost,
};
