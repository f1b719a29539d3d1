// model/model_synth.c — a model at a named real shape with seeded synthetic weights
// (weights/synthetic.h). No file and no tokenizer: it exists to measure speed at real scale.
// Scales keep activations O(1) through every layer: projections are uniform with std
// 1/sqrt(fan_in) (scale sqrt(3 / fan_in), as uniform[-1,1) has std 1/sqrt(3)), so each
// projection of an RMS-normalised row has unit variance; the embedding and LM head have std
// 1/sqrt(d), so logits of the normalised final row have std ~1; norm weights are 1 +- 0.1 and
// QKV biases +-0.1. Rotation is NEOX (half split): no GGUF row permutation is involved.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "../weights/dequant.h"
#include "model.h"

// inv_freq[j] = theta^(-2j/hd), with Llama 3's "llama3" scaling when s->rope_factor > 0:
// wavelengths above orig_ctx/low are divided by factor, below orig_ctx/high kept, and smoothly
// interpolated in between.
static void synth_rope_freqs(const synth_shape *s, model_config *c) {
    int half = c->head_dim / 2;
    c->inv_freq = xmalloc((size_t)half * sizeof(float));
    for (int j = 0; j < half; j++) {
        double f = pow(s->rope_theta, -2.0 * j / c->head_dim);
        if (s->rope_factor > 0) {
            double wavelen = 2 * M_PI / f, low_wl = s->rope_orig_ctx / s->rope_low,
                   high_wl = s->rope_orig_ctx / s->rope_high;
            if (wavelen > low_wl) f /= s->rope_factor;
            else if (wavelen >= high_wl) {
                double smooth = (s->rope_orig_ctx / wavelen - s->rope_low) /
                                (s->rope_high - s->rope_low);
                f = (1 - smooth) * f / s->rope_factor + smooth * f;
            }
        }
        c->inv_freq[j] = (float)f;
    }
}

void model_config_synth(const synth_shape *s, model_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->arch, sizeof c->arch, "%s", s->arch);
    c->n_layer = s->n_layer;
    c->d_model = s->d_model;
    c->n_head = s->n_head;
    c->n_kv_head = s->n_kv_head;
    c->head_dim = s->head_dim;
    c->d_ff = s->d_ff;
    c->vocab = s->vocab;
    c->ctx_len = s->ctx_len;
    c->rms_eps = s->rms_eps;
    c->rope = ROPE_NEOX;
    c->qkv_bias = strcmp(s->arch, "qwen2") == 0;
    c->tied = s->tied;
    synth_rope_freqs(s, c);
}

// One synthetic (rows, cols) tensor: with s->wtype, a matrix of random blocks of that type (std
// scale / sqrt(3), as the fp32 values); else made by the backend (weight_synth).
// Counted in m->n_params. NULL + err when out of memory.
static bk_weight *synth_weight(model *m, const synth_shape *sh, uint64_t tensor, size_t rows,
                               size_t cols, float scale, float offset, char *err, size_t errlen) {
    backend *bk = m->bk;
    bk_weight *w = NULL;
    uint64_t seed = sh->seed;
    if (sh->wtype != GGML_F32 && rows > 1) {
        size_t bytes = rows * dq_bytes(sh->wtype, cols);
        void *host = bytes ? malloc(bytes) : NULL;
        if (host && synth_blocks(sh->wtype, host, rows, cols, seed, tensor, scale / sqrtf(3.0f)) == 0)
            w = model_weight(m, (bk_tensor){sh->wtype, host, rows, cols, 1});
        else free(host);
    } else {
        w = bk->weight_synth(bk, seed, tensor, rows, cols, scale, offset);
        if (w) m->weight_bytes += (double)bk->weight_bytes(bk, (bk_tensor){GGML_F32, NULL, rows, cols, 1});
    }
    if (!w) err_printf(err, errlen, "out of memory for synthetic tensor %llu (%zu x %zu) on %s",
                       (unsigned long long)tensor, rows, cols, bk->name);
    m->n_params += rows * cols;
    return w;
}

static int synth_layer(model *m, const synth_shape *sh, int l, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    layer_weights *w = &m->layers[l];
    size_t d = c->d_model, f = c->d_ff, q = (size_t)c->n_head * c->head_dim,
           kv = (size_t)c->n_kv_head * c->head_dim;
    float sd = sqrtf(3.0f / d), sq = sqrtf(3.0f / q), sf = sqrtf(3.0f / f);
    // the order defines the tensor ids (synthetic.h)
    struct { bk_weight **dst; size_t rows, cols; float scale, offset; } t[] = {
        {&w->attn_norm, 1, d, 0.1f, 1}, {&w->wq, q, d, sd, 0}, {&w->wk, kv, d, sd, 0},
        {&w->wv, kv, d, sd, 0},         {&w->wo, d, q, sq, 0}, {&w->ffn_norm, 1, d, 0.1f, 1},
        {&w->w_gate, f, d, sd, 0},      {&w->w_up, f, d, sd, 0}, {&w->w_down, d, f, sf, 0},
        {&w->bq, 1, q, 0.1f, 0},        {&w->bk, 1, kv, 0.1f, 0}, {&w->bv, 1, kv, 0.1f, 0},
    };
    int n = c->qkv_bias ? 12 : 9;
    for (int i = 0; i < n; i++) {
        uint64_t id = (uint64_t)SYNTH_LAYER_BASE * (uint64_t)(l + 1) + (uint64_t)i;
        *t[i].dst = synth_weight(m, sh, id, t[i].rows, t[i].cols, t[i].scale, t[i].offset, err,
                                 errlen);
        if (!*t[i].dst) return -1;
    }
    return 0;
}

model *model_load_synth(const synth_shape *s, backend *bk, char *err, size_t errlen) {
    model *m = xcalloc(1, sizeof *m);
    m->bk = bk;
    model_config_synth(s, &m->cfg);
    const model_config *c = &m->cfg;
    m->layers = xcalloc((size_t)c->n_layer, sizeof *m->layers);
    char name[96];
    snprintf(name, sizeof name, "%s%s@%llu", SYNTH_PREFIX, s->name, (unsigned long long)s->seed);
    m->name = strdup(name);
    size_t d = c->d_model, V = c->vocab;
    float se = sqrtf(3.0f / d);
    m->tok_embd = synth_weight(m, s, 0, V, d, se, 0, err, errlen);
    m->embd_bytes = m->weight_bytes;
    int ok = m->tok_embd &&
             (m->out_norm = synth_weight(m, s, 1, 1, d, 0.1f, 1, err, errlen)) &&
             (m->lm_head = c->tied ? m->tok_embd
                                   : synth_weight(m, s, 2, V, d, se, 0, err, errlen));
    for (int l = 0; ok && l < c->n_layer; l++) ok = synth_layer(m, s, l, err, errlen) == 0;
    if (!ok) {
        model_free(m);
        return NULL;
    }
    model_fuse(m);
    return m;
}
