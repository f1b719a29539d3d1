// policies/specprefill.c — `specprefill`: Speculative Prefill (specs/specprefill.md). A speculator
// reads the whole prompt plus a few lookahead tokens (greedy, or drawn with the request's own
// sampling settings when its temperature is > 0): a --draft model with the same tokenizer, as
// in the paper, or without one [D] a self-draft, the main model's first --draft-layers layers
// (default ceil(L/2)) + final norm + LM head, which is NOT the paper's method. The attention of
// those query rows over the prompt, pooled and maxed over (layer, head) and averaged over the
// rows, scores every prompt token. The main model then prefills only the top chunks (and the
// last chunk, unless --keep-last off), each token at its original position; decoding goes on at
// positions M, M+1, ... over the shorter cache. The speculator's rows count in the prefill's
// rows (in main-model layer rows), and the label says which speculator ran.
#include "specprefill.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/score.h"
#include "../model/cost.h"
#include "../util/check.h"
#include "policy.h"

int specprefill_select(const float *score, int m, int chunk, float keep, int keep_last, int *idx) {
    int nc = (m + chunk - 1) / chunk;
    float *cs = xmalloc((size_t)nc * sizeof(float));
    int *top = xmalloc((size_t)(nc + 1) * sizeof(int));
    for (int c = 0; c < nc; c++) {
        int lo = c * chunk, hi = lo + chunk < m ? lo + chunk : m;
        double sum = 0;
        for (int i = lo; i < hi; i++) sum += score[i];
        cs[c] = (float)(sum / (hi - lo));
    }
    // keep is a float: 10 * 0.3f is 3.0000001, which must give 3 chunks, not 4
    int k = score_topk(cs, nc, (int)ceil(nc * (double)keep * (1 - 1e-6)), top);
    if (keep_last && (k == 0 || top[k - 1] != nc - 1)) top[k++] = nc - 1;   // [D] --keep-last on
    int n = 0;
    for (int j = 0; j < k; j++)
        for (int i = top[j] * chunk; i < m && i < (top[j] + 1) * chunk; i++) idx[n++] = i;
    free(cs);
    free(top);
    return n;
}

// Steps A-E: s_j for the current query row is built in row_max while the speculator runs;
// score accumulates the sum over rows, on the speculator's backend; one copy to the host at E.
typedef struct {
    int m, pool, depth;
    float *pooled;           // (heads, m) backend memory: one row's pooled attention at one layer
    float *row_max, *score;  // (m,) backend memory each: D's max so far, the sum over rows
    int rows;
} spec_scorer;

// D: the row's attention over the m prompt keys at layer l, each head's average-pooled
// (fwd_window_scores over every key: score_window_pool of one row), folded into the max over
// (layer, head); at the speculator's last layer the row's max goes into the sum over rows.
// Backend memory throughout: nothing per token crosses to the host until E.
static int spec_after_attention(void *ctx, fwd_state *s, int l, const void *q) {
    spec_scorer *sc = ctx;
    fwd_window_scores(s, l, q, 1, sc->m, sc->m, sc->pool, 1, sc->pooled);
    fwd_score_fold_max(s->m, sc->row_max, sc->score, sc->pooled, s->m->cfg.n_head, sc->m,
                       l == sc->depth - 1);
    return 0;
}

static int spec_after_layer(void *ctx, fwd_state *s, int l) {
    (void)s;
    return l == ((spec_scorer *)ctx)->depth - 1 ? FWD_STOP : 0;
}

// Layers of the speculator: all of a --draft's; --draft-layers of the main model's; by default
// [D] half of them, ceil(L/2). Measured on SmolLM2-135M passkey prompts (tests/test_fidelity.py,
// 2026-11-22): an 8-layer self-draft (L/4) lost the needle on 1 of the 4 prompts full solved,
// 15 layers on none. A shallower draft is faster: pass --draft-layers for that trade.
// The --draft model (NULL: a self-draft).
static const model *draft_of(const strategy_run *run) { return run->draft ? run->draft->m : NULL; }

static int spec_depth(const model *m, const strategy_opts *o, const model *draft) {
    if (draft) return draft->cfg.n_layer;
    return o->draft_layers > 0 ? o->draft_layers : (m->cfg.n_layer + 1) / 2;
}

// B's tokens: greedy, as the spec, when the request is greedy (temperature <= 0); else [D]
// drawn with the request's own sampling settings (run->sampling) by a generator of their own,
// seeded from the request's seed XOR a constant: the request's draws stay as they were, and
// the lookahead does not replay them.
static void lookahead_sampler(sampler *smp, const strategy_run *run, int vocab) {
    sample_params p = run->sampling;
    p.seed ^= 0x9e3779b97f4a7c15ULL;
    sampler_init(smp, &p, vocab);
}

// score (m,) of the prompt ids (m,) from the speculator, or NULL + err when out of memory;
// *rows = the speculator's rows processed summed over its layers (prompt and lookahead passes).
static float *speculate(context *main_cx, const int *ids, int m, const strategy_opts *o,
                        const strategy_run *run, long *rows, char *err, size_t errlen) {
    context *sx = run->draft ? run->draft : main_cx;   // the speculator's run
    const model *s = sx->m;
    int depth = spec_depth(main_cx->m, o, draft_of(run)), steps = o->lookahead - 1;
    int *caps = xmalloc((size_t)s->cfg.n_layer * sizeof(int));
    int *pos = xmalloc((size_t)m * sizeof(int));
    for (int l = 0; l < s->cfg.n_layer; l++) caps[l] = l < depth ? m + steps : 0;
    for (int i = 0; i < m; i++) pos[i] = i;
    kv_cache *kv = fwd_kv_create(sx, caps, err, errlen);
    free(caps);
    if (!kv) {
        free(pos);
        return NULL;
    }
    float *score = xcalloc((size_t)m, sizeof(float));   // zeros, then the result
    spec_scorer sc = {.m = m, .pool = o->spec_pool, .depth = depth,
                      .pooled = fwd_scratch(s, (size_t)s->cfg.n_head * m * sizeof(float)),
                      .row_max = fwd_scratch(s, (size_t)m * sizeof(float)),
                      .score = fwd_scratch(s, (size_t)m * sizeof(float))};
    fwd_floats_from_host(s, sc.row_max, score, (size_t)m);
    fwd_floats_from_host(s, sc.score, score, (size_t)m);
    fwd_hooks hooks = {.ctx = &sc, .after_attention = spec_after_attention,
                       .after_layer = spec_after_layer};
    float *logits = steps > 0 ? xmalloc((size_t)s->cfg.vocab * sizeof(float)) : NULL;
    sampler smp;
    lookahead_sampler(&smp, run, s->cfg.vocab);
    // A: the last prompt token is row 0; B: lookahead rows 1..N-1, each token drawn where the
    // logits are (on a GPU only the token comes back)
    int tok = -1;
    *rows = steps > 0 ? fwd_run_draw(sx, kv, ids, pos, m, &hooks, logits, &smp, &tok)
                      : fwd_run(sx, kv, ids, pos, m, &hooks, NULL, 0);
    sc.rows++;
    for (int t = 0; t < steps; t++) {
        int p = m + t, next = -1;
        if (run->is_eog && run->is_eog(run->eog_ctx, tok)) break;
        *rows += t + 1 < steps ? fwd_run_draw(sx, kv, &tok, &p, 1, &hooks, logits, &smp, &next)
                               : fwd_run(sx, kv, &tok, &p, 1, &hooks, NULL, 0);
        tok = next;
        sc.rows++;
    }
    fwd_floats_to_host(s, score, sc.score, (size_t)m);    // E: the sums, once per request
    for (int i = 0; i < m; i++) score[i] /= sc.rows;      //    then the mean over rows
    sampler_free(&smp);
    kv_free(kv);
    free(logits);
    fwd_scratch_free(s, sc.pooled), fwd_scratch_free(s, sc.row_max), fwd_scratch_free(s, sc.score);
    free(pos);
    return score;
}

// [D] The speculator's work in main-model layer rows: a self-draft's layers are the main
// model's; a --draft's layer rows are scaled by its FLOPs per row and layer (projections and
// MLP, model/cost.h) over the main model's.
static long draft_rows_as_main(const model *m, const model *draft, long rows) {
    if (!draft) return rows;
    return lround((double)rows * cost_layer_row_flops(&draft->cfg) /
                  cost_layer_row_flops(&m->cfg));
}

// info->label, and the note: which speculator ran ("draft: FILE" by the base name of --draft's
// path, or the draft's own name when no path was given).
static void spec_label(const model *m, const strategy_opts *o, const model *draft,
                       prefill_info *info) {
    if (draft) {
        char path[256];
        snprintf(path, sizeof path, "%s", o->draft_path ? o->draft_path : draft->name);
        for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--) path[n - 1] = 0;
        const char *base = strrchr(path, '/');
        snprintf(info->label, sizeof info->label, "draft: %.80s", base && base[1] ? base + 1 : path);
    } else if (spec_depth(m, o, NULL) == m->cfg.n_layer) {   // all layers: the model as its own draft
        snprintf(info->label, sizeof info->label, "draft: the model itself, all %d layers",
                 m->cfg.n_layer);
    } else {
        snprintf(info->label, sizeof info->label, "self-draft: first %d of %d layers",
                 spec_depth(m, o, NULL), m->cfg.n_layer);
    }
    snprintf(info->note, sizeof info->note, "%s", info->label);
}

// G: the main model prefills ids at the kept positions keep (k,), ascending; its rows are
// added to the draft's. The logits are the last KEPT token's: with --keep-last off the last
// prompt token may be dropped, and then, as in the authors' code (their kept set is the top
// chunks alone, and the engine samples from the last row it prefilled), the first generated
// token comes from an earlier token's row, still decoded at position M (H).
static kv_cache *prefill_kept(context *cx, const int *ids, const int *keep, int k, int n_gen,
                              float *logits, prefill_info *info, char *err, size_t errlen) {
    model *m = cx->m;
    int L = m->cfg.n_layer, *caps = xmalloc((size_t)L * sizeof(int));
    int *toks = xmalloc((size_t)k * sizeof(int));
    for (int l = 0; l < L; l++) caps[l] = k + n_gen;
    for (int j = 0; j < k; j++) toks[j] = ids[keep[j]];
    kv_cache *kv = fwd_kv_create(cx, caps, err, errlen);
    if (kv) info->rows_done = info->draft_rows + fwd_run(cx, kv, toks, keep, k, NULL, logits, 0);
    free(caps);
    free(toks);
    return kv;
}

// A --draft shares the main model's tokenizer (cmd/cli.c:load_draft compares them), but its
// embedding may have a different number of padding rows (Qwen2.5 0.5B: 151936, 7B: 152064):
// what matters is that it has a row for every prompt token. 1, or 0 with err.
static int draft_reads(const model *draft, const int *ids, int n, char *err, size_t errlen) {
    for (int i = 0; draft && i < n; i++)
        if (ids[i] >= draft->cfg.vocab) {
            snprintf(err, errlen, "prompt token %d is outside the draft's vocabulary of %d "
                     "tokens (a draft must share the tokenizer)", ids[i], draft->cfg.vocab);
            return 0;
        }
    return 1;
}

static kv_cache *specprefill_prefill(context *cx, const int *ids, int n, int n_gen,
                                     const strategy_opts *o, const strategy_run *run,
                                     float *logits, prefill_info *info, char *err, size_t errlen) {
    model *m = cx->m;
    int *keep = xmalloc((size_t)n * sizeof(int)), k = n;
    for (int i = 0; i < n; i++) keep[i] = i;
    info->draft_rows = 0;
    if (n <= o->chunk) {
        snprintf(info->note, sizeof info->note, "prompt of %d tokens is at most one chunk (%d): "
                 "ran full", n, o->chunk);
    } else {
        long rows = 0;
        float *score = draft_reads(draft_of(run), ids, n, err, errlen)
                           ? speculate(cx, ids, n, o, run, &rows, err, errlen) : NULL;
        if (!score) {
            free(keep);
            return NULL;
        }
        k = specprefill_select(score, n, o->chunk, o->keep, o->keep_last, keep);
        free(score);
        info->draft_rows = draft_rows_as_main(m, draft_of(run), rows);
        spec_label(m, o, draft_of(run), info);
    }
    kv_cache *kv = prefill_kept(cx, ids, keep, k, n_gen, logits, info, err, errlen);
    free(keep);
    return kv;
}

static int specprefill_check(const model *m, const strategy_opts *o, char *err, size_t errlen) {
    if (o->draft_layers <= m->cfg.n_layer) return 0;
    return err_printf(err, errlen, "--draft-layers %d is more than the model's %d layers",
                      o->draft_layers, m->cfg.n_layer);
}

// The self-draft's depth; with --draft none (0: the draft model's layers run, not the main's).
static void specprefill_resolve(const model *m, const strategy_run *run, strategy_opts *o) {
    o->draft_layers = run && run->draft ? 0 : spec_depth(m, o, NULL);
}

// The work: the speculator's D layers over the n prompt rows and the last row's scores over them
// (QK^T again, per layer), its lookahead - 1 one-token steps (D layers' weights, or the draft's,
// and their KV), then the main model over the kept chunks: ceil(chunks * keep) and the last, at
// their expected count (which chunks win is the prompt's).
static void specprefill_cost(const cost_shape *sh, const strategy_opts *o, cost_work *w) {
    const model_config *c = sh->c, *dc = sh->draft ? sh->draft : c;
    long n = sh->n;
    if (n <= o->chunk) {
        cost_full_prefill(sh, w);
        return;
    }
    int L = c->n_layer, D = sh->draft ? dc->n_layer : o->draft_layers > 0 ? o->draft_layers : (L + 1) / 2;
    int steps = o->lookahead - 1;
    double nc = ceil((double)n / o->chunk), kc = ceil(nc * o->keep * (1 - 1e-6)) + o->keep_last;
    double m = fmin((double)n, fmin(kc, nc) * o->chunk), step_w = sh->draft ? sh->draft_weight_bytes
                                                                  : sh->weight_bytes * D / L;
    *w = (cost_work){.gemm_flops = cost_lm_head_flops(c) + (steps > 0) * cost_lm_head_flops(dc),
                     .kv_entries = L * m};
    cost_add_layers(dc, w, D, (double)n, cost_causal_pairs((double)n));
    w->attn_flops += D * cost_attn_flops(dc, (double)n) / 2;   // row 0's scores
    for (int t = 0; t < steps; t++) {   // each step: D layers of one row over n + t + 1 keys
        double keys = (double)n + t + 1;
        w->step_bytes += step_w;
        w->step_kv_bytes += D * keys * dc->n_kv_head * (sh->k_row + sh->v_row);
        w->gemm_flops += cost_lm_head_flops(dc) * (t + 1 < steps);
    }
    cost_add_layers(c, w, L, m, cost_causal_pairs(m));
}

const strategy strategy_specprefill = {
    .name = "specprefill",
    .resolve = specprefill_resolve,
    .about = "a draft (--draft; else a self-draft, not the paper's method: the model's first "
             "--draft-layers N layers, default ceil(L/2)) picks the prompt chunks to prefill",
    .prefill = specprefill_prefill,
    .check = specprefill_check,
    .phase = PHASE_PREFILL,
    .cost_prefill = specprefill_cost,
};
