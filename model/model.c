// model/model.c — config from GGUF metadata and weight loading (each tensor handed to the backend
// as the file stores it, borrowed from the mapping).
// GGUF `llama` stores Q/K rows permuted for adjacent-pair rotation, so it runs with ROPE_NORM and
// the rows are used as stored; `qwen2` is not permuted and runs with ROPE_NEOX.
#include "model.h"
#include "forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "../weights/dequant.h"

// Reads "<arch>.<key>" as an int in [lo, hi]; def >= 0 is used when the key is absent.
static int arch_int(const gguf_file *f, const char *arch, const char *key, long def, long lo,
                    long hi, int *out, char *err, size_t errlen) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", arch, key);
    int64_t v;
    if (gguf_get_i64(f, name, &v) != 0) {
        if (def < 0) return err_printf(err, errlen, "missing or non-integer metadata '%s'", name);
        v = def;
    }
    if (v < lo || v > hi)
        return err_printf(err, errlen, "metadata '%s' = %lld is out of range [%ld, %ld]", name,
                    (long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

static float arch_float(const gguf_file *f, const char *arch, const char *key, double def) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s", arch, key);
    double v;
    return gguf_get_f64(f, name, &v) == 0 ? (float)v : (float)def;
}

static int rope_freqs(const gguf_file *f, model_config *c, float base, char *err, size_t errlen) {
    int half = c->head_dim / 2;
    c->inv_freq = xmalloc((size_t)half * sizeof(float));
    for (int j = 0; j < half; j++) c->inv_freq[j] = (float)pow(base, -2.0 * j / c->head_dim);
    const gguf_tensor *t = gguf_find_tensor(f, "rope_freqs.weight");
    if (!t) return 0;
    if (t->type != GGML_F32 || t->ne[0] != (uint64_t)half || t->ne[1] != 1)
        return err_printf(err, errlen, "tensor 'rope_freqs.weight' must be F32 [%d]", half);
    const float *factor = t->data;
    for (int j = 0; j < half; j++) {
        if (!(factor[j] > 0)) return err_printf(err, errlen, "rope_freqs.weight[%d] is not positive", j);
        c->inv_freq[j] /= factor[j];
    }
    return 0;
}

int model_config_from_gguf(const gguf_file *f, model_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    char *arch = gguf_get_str(f, "general.architecture");
    if (!arch) return err_printf(err, errlen, "missing metadata 'general.architecture'");
    int ok = strcmp(arch, "llama") == 0 || strcmp(arch, "qwen2") == 0;
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    if (!ok) {
        err_printf(err, errlen, "unsupported architecture '%s' (supported: llama, qwen2)", arch);
        free(arch);
        return -1;
    }
    free(arch);
    const char *a = c->arch;
    if (arch_int(f, a, "block_count", -1, 1, MODEL_MAX_LAYERS, &c->n_layer, err, errlen) ||
        arch_int(f, a, "embedding_length", -1, 1, MODEL_MAX_DIM, &c->d_model, err, errlen) ||
        arch_int(f, a, "feed_forward_length", -1, 1, 4 * MODEL_MAX_DIM, &c->d_ff, err, errlen) ||
        arch_int(f, a, "attention.head_count", -1, 1, 1024, &c->n_head, err, errlen) ||
        arch_int(f, a, "attention.head_count_kv", c->n_head, 1, c->n_head, &c->n_kv_head, err,
                 errlen) ||
        arch_int(f, a, "context_length", 4096, 1, MODEL_MAX_CTX, &c->ctx_len, err, errlen))
        return -1;
    if (c->n_head % c->n_kv_head)
        return err_printf(err, errlen, "head_count %d is not a multiple of head_count_kv %d", c->n_head,
                    c->n_kv_head);
    int hd_def = c->d_model / c->n_head;
    if (arch_int(f, a, "attention.key_length", hd_def, 2, 1024, &c->head_dim, err, errlen))
        return -1;
    int rope_dim = 0;
    if (arch_int(f, a, "rope.dimension_count", c->head_dim, 1, 1024, &rope_dim, err, errlen))
        return -1;
    if (rope_dim != c->head_dim || c->head_dim % 2)
        return err_printf(err, errlen, "partial or odd RoPE (rope dim %d, head dim %d) is not supported",
                    rope_dim, c->head_dim);
    c->rms_eps = arch_float(f, a, "attention.layer_norm_rms_epsilon", 1e-5);
    c->rope = strcmp(a, "qwen2") == 0 ? ROPE_NEOX : ROPE_NORM;
    c->qkv_bias = strcmp(a, "qwen2") == 0;
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb) return err_printf(err, errlen, "missing tensor 'token_embd.weight'");
    if (emb->ne[1] < 1 || emb->ne[1] > MODEL_MAX_VOCAB)
        return err_printf(err, errlen, "token_embd.weight has an absurd vocabulary of %llu rows",
                    (unsigned long long)emb->ne[1]);
    c->vocab = (int)emb->ne[1];
    c->tied = gguf_find_tensor(f, "output.weight") == NULL;
    return rope_freqs(f, c, arch_float(f, a, "rope.freq_base", 10000.0), err, errlen);
}

bk_weight *model_weight(model *m, bk_tensor t) {
    backend *bk = m->bk;
    double bytes = (double)bk->weight_bytes(bk, t);
    bk_weight *w = bk->weight(bk, t);
    if (w) m->weight_bytes += bytes;
    return w;
}

// Tensor `name` of shape (rows, cols) handed to the backend in its file encoding. NULL + err.
static bk_weight *load_tensor(const gguf_file *f, model *m, const char *name, size_t rows,
                              size_t cols, char *err, size_t errlen) {
    backend *bk = m->bk;
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) {
        err_printf(err, errlen, "missing tensor '%s'", name);
        return NULL;
    }
    size_t want_rows = rows ? rows : 1;
    if (t->ne[0] != cols || t->ne[1] * t->ne[2] * t->ne[3] != want_rows) {
        err_printf(err, errlen, "tensor '%s' has shape [%llu, %llu], expected [%zu, %zu]", name,
             (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], cols, want_rows);
        return NULL;
    }
    if (!dq_supported(t->type)) {
        err_printf(err, errlen, "tensor '%s' has unsupported type %s", name, gguf_type_name(t->type));
        return NULL;
    }
    bk_weight *w = model_weight(m, (bk_tensor){t->type, t->data, rows, cols, 0});
    if (!w) err_printf(err, errlen, "out of %s memory for tensor '%s'", bk->name, name);
    return w;
}

static int load_layer(const gguf_file *f, model *m, int l, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    layer_weights *w = &m->layers[l];
    size_t d = c->d_model, q = (size_t)c->n_head * c->head_dim, kv = (size_t)c->n_kv_head * c->head_dim;
    struct { bk_weight **dst; const char *name; size_t rows, cols; } t[] = {
        {&w->attn_norm, "attn_norm.weight", 0, d}, {&w->wq, "attn_q.weight", q, d},
        {&w->wk, "attn_k.weight", kv, d},          {&w->wv, "attn_v.weight", kv, d},
        {&w->wo, "attn_output.weight", d, q},       {&w->ffn_norm, "ffn_norm.weight", 0, d},
        {&w->w_gate, "ffn_gate.weight", c->d_ff, d}, {&w->w_up, "ffn_up.weight", c->d_ff, d},
        {&w->w_down, "ffn_down.weight", d, c->d_ff},
        {&w->bq, "attn_q.bias", 0, q}, {&w->bk, "attn_k.bias", 0, kv}, {&w->bv, "attn_v.bias", 0, kv},
    };
    int n = c->qkv_bias ? 12 : 9;
    for (int i = 0; i < n; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s", l, t[i].name);
        *t[i].dst = load_tensor(f, m, name, t[i].rows, t[i].cols, err, errlen);
        if (!*t[i].dst) return -1;
        m->n_params += (t[i].rows ? t[i].rows : 1) * t[i].cols;
    }
    return 0;
}

model *model_load_gguf(const gguf_file *f, backend *bk, char *err, size_t errlen) {
    model *m = xcalloc(1, sizeof *m);
    m->bk = bk;
    if (model_config_from_gguf(f, &m->cfg, err, errlen) != 0) {
        model_free(m);
        return NULL;
    }
    const model_config *c = &m->cfg;
    m->layers = xcalloc((size_t)c->n_layer, sizeof *m->layers);
    m->name = gguf_get_str(f, "general.name");
    m->tok_embd = load_tensor(f, m, "token_embd.weight", c->vocab, c->d_model, err, errlen);
    m->embd_bytes = m->weight_bytes;
    m->out_norm = m->tok_embd ? load_tensor(f, m, "output_norm.weight", 0, c->d_model, err, errlen) : NULL;
    if (!m->out_norm) {
        model_free(m);
        return NULL;
    }
    m->lm_head = c->tied ? m->tok_embd
                         : load_tensor(f, m, "output.weight", c->vocab, c->d_model, err, errlen);
    if (!m->lm_head) {
        model_free(m);
        return NULL;
    }
    m->n_params += (size_t)c->vocab * c->d_model * (c->tied ? 1 : 2) + c->d_model;
    for (int l = 0; l < c->n_layer; l++)
        if (load_layer(f, m, l, err, errlen) != 0) {
            model_free(m);
            return NULL;
        }
    model_fuse(m);
    return m;
}

void model_fuse(model *m) {
    backend *bk = m->bk;
    if (!bk->weight_fuse) return;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        layer_weights *w = &m->layers[l];
        if (!w->wqkv && w->wq && w->wk && w->wv)
            w->wqkv = bk->weight_fuse(bk, (bk_weight *const[]){w->wq, w->wk, w->wv}, 3);
        if (!w->w_gate_up && w->w_gate && w->w_up)
            w->w_gate_up = bk->weight_fuse(bk, (bk_weight *const[]){w->w_gate, w->w_up}, 2);
    }
}

void *model_derived_get(const model *m, const void *kind) {
    for (const model_derived *d = m->derived; d; d = d->next)
        if (d->kind == kind) return d->state;
    return NULL;
}

void model_derived_put(model *m, const void *kind, void *state, void (*free_state)(void *state)) {
    CHECK_INTERNAL(!model_derived_get(m, kind), "the model already keeps state of this kind");
    model_derived *d = xmalloc(sizeof *d);
    *d = (model_derived){kind, state, free_state, m->derived};
    m->derived = d;
}

void model_free(model *m) {
    if (!m) return;
    for (model_derived *d = m->derived, *next; d; d = next) {
        next = d->next;
        d->free(d->state);
        free(d);
    }
    m->derived = NULL;
    backend *bk = m->bk;
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layer; l++) {
            layer_weights *w = &m->layers[l];
            bk_weight *all[] = {w->attn_norm, w->wq, w->wk, w->wv, w->bq, w->bk, w->bv, w->wo,
                                w->ffn_norm, w->w_gate, w->w_up, w->w_down,
                                w->wqkv, w->w_gate_up};   // views before what they view
            for (size_t i = 0; i < sizeof all / sizeof *all; i++)
                if (all[i]) bk->weight_free(bk, all[i]);
        }
    for (int i = 0; i < m->n_extra; i++) {
        bk->weight_free(bk, m->extra[i].w);
        free(m->extra[i].name);
    }
    free(m->extra);
    if (m->lm_head && m->lm_head != m->tok_embd) bk->weight_free(bk, m->lm_head);
    if (m->tok_embd) bk->weight_free(bk, m->tok_embd);
    if (m->out_norm) bk->weight_free(bk, m->out_norm);
    free(m->layers);
    free(m->cfg.inv_freq);
    free(m->name);
    free(m);
}
