// policies/specprefill.c — `specprefill`: Speculative Prefill (specs/specprefill.md). A speculator
// (a --draft model with the same tokenizer, or the main model's first --draft-layers layers, by
// default L/2, + final norm + LM head) reads the whole prompt plus a few greedy lookahead tokens;
// the attention of those query rows over the prompt, pooled and maxed over (layer, head) and
// averaged over the rows, scores every prompt token. The main model then prefills only the top
// chunks, each token at its original position; decoding goes on at positions M, M+1, ... over the
// shorter cache.
#include "specprefill.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/score.h"
#include "../util/check.h"
#include "policy.h"

void specprefill_fold_row(const float *probs, int heads, int m, int pool, float *row_max) {
    float *pooled = xmalloc((size_t)m * sizeof(float));
    for (int h = 0; h < heads; h++) {
        score_avgpool(probs + (size_t)h * m, m, pool, pooled);
        for (int i = 0; i < m; i++)
            if (pooled[i] > row_max[i]) row_max[i] = pooled[i];
    }
    free(pooled);
}

int specprefill_select(const float *score, int m, int chunk, float keep, int *idx) {
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
    if (k == 0 || top[k - 1] != nc - 1) top[k++] = nc - 1;   // the last chunk is always kept
    int n = 0;
    for (int j = 0; j < k; j++)
        for (int i = top[j] * chunk; i < m && i < (top[j] + 1) * chunk; i++) idx[n++] = i;
    free(cs);
    free(top);
    return n;
}

// Steps A-E: s_j for the current query row is built in row_max while the speculator runs;
// score accumulates the sum over rows.
typedef struct {
    int m, pool, depth;      // context keys, pooling kernel, speculator layers
    float *probs;            // (heads, m) one row's attention at one layer
    float *row_max, *score;  // (m,) each
    int rows;
} spec_scorer;

static int spec_after_attention(void *ctx, fwd_state *s, int l, const void *q) {
    spec_scorer *sc = ctx;
    fwd_attn_probs(s, l, q, 1, sc->m, sc->probs);
    specprefill_fold_row(sc->probs, s->m->cfg.n_head, sc->m, sc->pool, sc->row_max);
    return 0;
}

static int spec_after_layer(void *ctx, fwd_state *s, int l) {
    (void)s;
    return l == ((spec_scorer *)ctx)->depth - 1 ? FWD_STOP : 0;
}

static void spec_end_row(spec_scorer *sc) {
    for (int i = 0; i < sc->m; i++) sc->score[i] += sc->row_max[i];
    memset(sc->row_max, 0, (size_t)sc->m * sizeof(float));
    sc->rows++;
}

// Layers of the speculator: all of a --draft's; --draft-layers of the main model's; by default
// [D] half of them, ceil(L/2). Measured on SmolLM2-135M passkey prompts (tests/test_fidelity.py,
// 2026-11-22): an 8-layer self-draft (L/4) lost the needle on 1 of the 4 prompts full solved,
// 15 layers on none. A shallower draft is faster: pass --draft-layers for that trade.
static int spec_depth(const model *m, const strategy_opts *o) {
    if (o->draft) return o->draft->cfg.n_layer;
    return o->draft_layers > 0 ? o->draft_layers : (m->cfg.n_layer + 1) / 2;
}

// score (m,) of the prompt ids (m,) from the speculator, or NULL + err when out of memory.
static float *speculate(model *main_m, const int *ids, int m, const strategy_opts *o, char *err,
                        size_t errlen) {
    model *s = o->draft ? o->draft : main_m;
    int depth = spec_depth(main_m, o), steps = o->lookahead - 1;
    int *caps = xmalloc((size_t)s->cfg.n_layer * sizeof(int));
    int *pos = xmalloc((size_t)m * sizeof(int));
    for (int l = 0; l < s->cfg.n_layer; l++) caps[l] = l < depth ? m + steps : 0;
    for (int i = 0; i < m; i++) pos[i] = i;
    kv_cache *kv = fwd_kv_create(s, caps, err, errlen);
    free(caps);
    if (!kv) {
        free(pos);
        return NULL;
    }
    spec_scorer sc = {.m = m, .pool = o->spec_pool, .depth = depth,
                      .probs = xmalloc((size_t)s->cfg.n_head * m * sizeof(float)),
                      .row_max = calloc((size_t)m, sizeof(float)),
                      .score = calloc((size_t)m, sizeof(float))};
    CHECK_INTERNAL(sc.row_max && sc.score, "out of memory for %d token scores", m);
    fwd_hooks hooks = {.ctx = &sc, .after_attention = spec_after_attention,
                       .after_layer = spec_after_layer};
    float *logits = steps > 0 ? xmalloc((size_t)s->cfg.vocab * sizeof(float)) : NULL;
    fwd_run(s, kv, ids, pos, m, &hooks, logits, 0);   // A: the last prompt token is row 0
    spec_end_row(&sc);
    for (int t = 0; t < steps; t++) {                  // B: greedy lookahead rows 1..N-1
        int tok = sample_argmax(logits, s->cfg.vocab), p = m + t;
        if (o->is_eog && o->is_eog(o->eog_ctx, tok)) break;
        fwd_run(s, kv, &tok, &p, 1, &hooks, t + 1 < steps ? logits : NULL, 0);
        spec_end_row(&sc);
    }
    for (int i = 0; i < m; i++) sc.score[i] /= sc.rows;   // E: mean over rows
    kv_free(kv);
    free(logits);
    free(sc.probs);
    free(sc.row_max);
    free(pos);
    return sc.score;
}

// G: the main model prefills ids at the kept positions keep (k,), ascending.
static kv_cache *prefill_kept(model *m, const int *ids, const int *keep, int k, int n_gen,
                              float *logits, prefill_info *info, char *err, size_t errlen) {
    int L = m->cfg.n_layer, *caps = xmalloc((size_t)L * sizeof(int));
    int *toks = xmalloc((size_t)k * sizeof(int));
    for (int l = 0; l < L; l++) caps[l] = k + n_gen;
    for (int j = 0; j < k; j++) toks[j] = ids[keep[j]];
    kv_cache *kv = fwd_kv_create(m, caps, err, errlen);
    if (kv) info->rows_done = fwd_run(m, kv, toks, keep, k, NULL, logits, 0);
    free(caps);
    free(toks);
    return kv;
}

// A --draft shares the main model's tokenizer (main.c compares them), but its embedding may have
// a different number of padding rows (Qwen2.5 0.5B: 151936, 7B: 152064): what matters is that
// it has a row for every prompt token. 1, or 0 with err.
static int draft_reads(const strategy_opts *o, const int *ids, int n, char *err, size_t errlen) {
    for (int i = 0; o->draft && i < n; i++)
        if (ids[i] >= o->draft->cfg.vocab) {
            snprintf(err, errlen, "prompt token %d is outside the draft's vocabulary of %d "
                     "tokens (a draft must share the tokenizer)", ids[i], o->draft->cfg.vocab);
            return 0;
        }
    return 1;
}

static kv_cache *specprefill_prefill(model *m, const int *ids, int n, int n_gen,
                                     const strategy_opts *o, float *logits, prefill_info *info,
                                     char *err, size_t errlen) {
    int *keep = xmalloc((size_t)n * sizeof(int)), k = n;
    for (int i = 0; i < n; i++) keep[i] = i;
    if (n <= o->chunk) {
        snprintf(info->note, sizeof info->note, "prompt of %d tokens is at most one chunk (%d): "
                 "ran full", n, o->chunk);
    } else {
        float *score = draft_reads(o, ids, n, err, errlen) ? speculate(m, ids, n, o, err, errlen)
                                                            : NULL;
        if (!score) {
            free(keep);
            return NULL;
        }
        k = specprefill_select(score, n, o->chunk, o->keep, keep);
        free(score);
    }
    kv_cache *kv = prefill_kept(m, ids, keep, k, n_gen, logits, info, err, errlen);
    free(keep);
    return kv;
}

static int specprefill_check(const model *m, const strategy_opts *o, char *err, size_t errlen) {
    if (o->draft_layers <= m->cfg.n_layer) return 0;
    snprintf(err, errlen, "--draft-layers %d is more than the model's %d layers", o->draft_layers,
             m->cfg.n_layer);
    return -1;
}

const strategy strategy_specprefill = {
    .name = "specprefill",
    .about = "a draft (--draft, --draft-layers; L/4 layers) picks the prompt chunks to prefill",
    .prefill = specprefill_prefill,
    .check = specprefill_check,
    .phase = PHASE_PREFILL,
};
