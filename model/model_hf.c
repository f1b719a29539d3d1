// model/model_hf.c — a model from a Hugging Face directory (weights/hf.h): config.json -> config,
// safetensors F32/F16/BF16 -> fp32 on the backend. HF keeps Q/K rows unpermuted and rotates
// half-split, so every HF model runs with ROPE_NEOX. Tensors the architecture does not use are
// uploaded as named extras for policies (model_find_extra).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "../weights/dequant.h"
#include "../weights/hf.h"
#include "model.h"

// Integer config key in [lo, hi]; def >= 0 when absent.
static int cfg_int(const hf_dir *h, const char *key, long long def, long long lo, long long hi,
                   int *out, char *err, size_t errlen) {
    long long v = def;
    int rc = hf_cfg_int(h, key, &v);
    if (rc < 0 || (rc == 1 && def < 0))
        return err_printf(err, errlen, "config.json: '%s' is %s", key,
                          rc < 0 ? "not an integer" : "missing");
    if (v < lo || v > hi)
        return err_printf(err, errlen, "config.json: '%s' = %lld is out of range [%lld, %lld]", key,
                          v, lo, hi);
    *out = (int)v;
    return 0;
}

static int cfg_num(const hf_dir *h, const char *key, double def, double *out, char *err,
                   size_t errlen) {
    *out = def;
    if (hf_cfg_num(h, key, out) < 0 || !isfinite(*out))
        return err_printf(err, errlen, "config.json: '%s' is not a number", key);
    return 0;
}

static int cfg_bool(const hf_dir *h, const char *key, int def, int *out, char *err, size_t errlen) {
    *out = def;
    if (hf_cfg_bool(h, key, out) < 0)
        return err_printf(err, errlen, "config.json: '%s' is not a bool", key);
    return 0;
}

// Llama 3.1's rope_scaling "llama3": low frequencies (wavelength above original_ctx /
// low_freq_factor) are divided by factor, high ones (below original_ctx / high_freq_factor)
// kept, the band between interpolated linearly in original_ctx / wavelength.
static int rope_llama3(const hf_dir *h, model_config *c, char *err, size_t errlen) {
    double factor, lo, hi, orig;
    if (cfg_num(h, "rope_scaling.factor", NAN, &factor, err, errlen) ||
        cfg_num(h, "rope_scaling.low_freq_factor", NAN, &lo, err, errlen) ||
        cfg_num(h, "rope_scaling.high_freq_factor", NAN, &hi, err, errlen) ||
        cfg_num(h, "rope_scaling.original_max_position_embeddings", NAN, &orig, err, errlen))
        return -1;
    if (!(factor > 0) || !(lo > 0) || !(hi > lo) || !(orig > 0))
        return err_printf(
            err, errlen,
            "config.json: rope_scaling llama3 needs factor > 0, "
            "0 < low_freq_factor < high_freq_factor, original_max_position_embeddings > 0");
    for (int j = 0; j < c->head_dim / 2; j++) {
        double f = c->inv_freq[j], wavelen = 2 * M_PI / f;
        if (wavelen > orig / lo)
            f /= factor;
        else if (wavelen >= orig / hi) {
            double s = (orig / wavelen - lo) / (hi - lo);
            f = (1 - s) * f / factor + s * f;
        }
        c->inv_freq[j] = (float)f;
    }
    return 0;
}

static int rope_config(const hf_dir *h, model_config *c, char *err, size_t errlen) {
    double theta;
    if (cfg_num(h, "rope_theta", 10000.0, &theta, err, errlen)) return -1;
    if (!(theta > 1))
        return err_printf(err, errlen, "config.json: rope_theta %g must be > 1", theta);
    c->inv_freq = xmalloc((size_t)(c->head_dim / 2) * sizeof(float));
    for (int j = 0; j < c->head_dim / 2; j++)
        c->inv_freq[j] = (float)pow(theta, -2.0 * j / c->head_dim);
    const char *type = hf_cfg_str(h, "rope_scaling.rope_type");
    if (!type) type = hf_cfg_str(h, "rope_scaling.type");
    if (!type || strcmp(type, "default") == 0) return 0;
    if (strcmp(type, "llama3") == 0) return rope_llama3(h, c, err, errlen);
    return err_printf(err, errlen,
                      "config.json: rope_scaling type '%s' is not supported (llama3 is)", type);
}

int model_config_from_hf(const hf_dir *h, model_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    const char *fam = hf_arch_family(h), *act = hf_cfg_str(h, "hidden_act");
    if (!fam)
        return err_printf(err, errlen,
                          "config.json: architecture '%s' is not supported "
                          "(LlamaForCausalLM, Qwen2ForCausalLM)",
                          hf_cfg_arch(h) ? hf_cfg_arch(h) : "(none)");
    snprintf(c->arch, sizeof c->arch, "%s", fam);
    if (act && strcmp(act, "silu") != 0)
        return err_printf(err, errlen, "config.json: hidden_act '%s' is not supported (silu)", act);
    if (cfg_int(h, "num_hidden_layers", -1, 1, MODEL_MAX_LAYERS, &c->n_layer, err, errlen) ||
        cfg_int(h, "hidden_size", -1, 1, MODEL_MAX_DIM, &c->d_model, err, errlen) ||
        cfg_int(h, "intermediate_size", -1, 1, 4 * MODEL_MAX_DIM, &c->d_ff, err, errlen) ||
        cfg_int(h, "num_attention_heads", -1, 1, 1024, &c->n_head, err, errlen) ||
        cfg_int(h, "num_key_value_heads", c->n_head, 1, c->n_head, &c->n_kv_head, err, errlen) ||
        cfg_int(h, "head_dim", c->d_model / c->n_head, 2, 1024, &c->head_dim, err, errlen) ||
        cfg_int(h, "vocab_size", -1, 1, MODEL_MAX_VOCAB, &c->vocab, err, errlen) ||
        cfg_int(h, "max_position_embeddings", 4096, 1, MODEL_MAX_CTX, &c->ctx_len, err, errlen))
        return -1;
    if (c->n_head % c->n_kv_head || c->head_dim % 2)
        return err_printf(err, errlen,
                          "config.json: %d heads over %d KV heads of dim %d do not "
                          "fit (heads a multiple of KV heads, even head dim)",
                          c->n_head, c->n_kv_head, c->head_dim);
    double eps;
    int attn_bias, mlp_bias;
    if (cfg_num(h, "rms_norm_eps", 1e-6, &eps, err, errlen) ||
        cfg_bool(h, "tie_word_embeddings", 0, &c->tied, err, errlen) ||
        cfg_bool(h, "attention_bias", 0, &attn_bias, err, errlen) ||
        cfg_bool(h, "mlp_bias", 0, &mlp_bias, err, errlen))
        return -1;
    if ((attn_bias && strcmp(fam, "llama") == 0) || mlp_bias)
        return err_printf(err, errlen,
                          "config.json: attention_bias/mlp_bias on a Llama model "
                          "(biases on o_proj or the MLP) are not supported");
    c->rms_eps = (float)eps;
    c->rope = ROPE_NEOX;
    c->qkv_bias = strcmp(fam, "qwen2") == 0;
    return rope_config(h, c, err, errlen);
}

// Tensor `name` of shape (rows, cols) (rows 0: a vector) as fp32 on the backend. NULL + err when
// absent (if required), of another shape, or not F32/F16/BF16.
static bk_weight *load_tensor(const hf_dir *h, model *m, const char *name, size_t rows,
                              size_t cols, int required, char *err, size_t errlen) {
    const st_tensor *t = hf_find_tensor(h, name);
    if (!t) {
        if (required) err_printf(err, errlen, "missing tensor '%s'", name);
        return NULL;
    }
    int ok = rows ? t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols
                  : t->n_dims == 1 && t->shape[0] == cols;
    if (!ok) {
        err_printf(err, errlen, "tensor '%s' has %d dims [%llu, ...], expected [%zu, %zu]", name,
                   t->n_dims, (unsigned long long)(t->n_dims ? t->shape[0] : 0), rows, cols);
        return NULL;
    }
    if (t->ggml_type == UINT32_MAX) {
        err_printf(err, errlen, "tensor '%s' has dtype %s (supported: F32, F16, BF16)", name,
                   t->dtype);
        return NULL;
    }
    bk_weight *w = model_weight(m, (bk_tensor){t->ggml_type, t->data, rows, cols, 0});
    if (!w) err_printf(err, errlen, "out of %s memory for tensor '%s'", m->bk->name, name);
    return w;
}

static const char *const LAYER_TENSORS[] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight",
    "self_attn.q_proj.bias",   "self_attn.k_proj.bias",   "self_attn.v_proj.bias",
};

// q/k/v (and their biases) may be absent together; the rest is required.
static int load_layer(const hf_dir *h, model *m, int l, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    layer_weights *w = &m->layers[l];
    size_t d = c->d_model, q = (size_t)c->n_head * c->head_dim,
           kv = (size_t)c->n_kv_head * c->head_dim;
    struct {
        bk_weight **dst;
        size_t rows, cols;
    } t[] = {
        {&w->attn_norm, 0, d},    {&w->wq, q, d},         {&w->wk, kv, d},
        {&w->wv, kv, d},          {&w->wo, d, q},         {&w->ffn_norm, 0, d},
        {&w->w_gate, c->d_ff, d}, {&w->w_up, c->d_ff, d}, {&w->w_down, d, c->d_ff},
        {&w->bq, 0, q},           {&w->bk, 0, kv},        {&w->bv, 0, kv},
    };
    char name[128];
    snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", l);
    int has_qkv = hf_find_tensor(h, name) != NULL;
    int n = c->qkv_bias ? 12 : 9;
    for (int i = 0; i < n; i++) {
        int is_qkv = (i >= 1 && i <= 3) || i >= 9;
        if (is_qkv && !has_qkv) continue;
        snprintf(name, sizeof name, "model.layers.%d.%s", l, LAYER_TENSORS[i]);
        *t[i].dst = load_tensor(h, m, name, t[i].rows, t[i].cols, 1, err, errlen);
        if (!*t[i].dst) return -1;
        m->n_params += (t[i].rows ? t[i].rows : 1) * t[i].cols;
    }
    return 0;
}

// A name the architecture uses (or ignores: rotary_emb.inv_freq buffers of old exports).
static int is_architecture_tensor(const char *name) {
    if (strcmp(name, "model.embed_tokens.weight") == 0 || strcmp(name, "model.norm.weight") == 0 ||
        strcmp(name, "lm_head.weight") == 0 || strstr(name, "rotary_emb.inv_freq"))
        return 1;
    int l, at = 0;
    if (sscanf(name, "model.layers.%d.%n", &l, &at) != 1 || at == 0) return 0;
    for (size_t i = 0; i < sizeof LAYER_TENSORS / sizeof *LAYER_TENSORS; i++)
        if (strcmp(name + at, LAYER_TENSORS[i]) == 0) return 1;
    return 0;
}

// Every float vector or matrix of the checkpoint beyond the architecture, uploaded by name.
static int load_extras(const hf_dir *h, model *m, char *err, size_t errlen) {
    for (int s = 0; s < h->n_shards; s++)
        for (size_t i = 0; i < h->shards[s]->n_tensors; i++) {
            const st_tensor *t = &h->shards[s]->tensors[i];
            if (is_architecture_tensor(t->name) || t->n_dims < 1 || t->n_dims > 2 ||
                t->n_elems == 0)
                continue;
            size_t rows = t->n_dims == 2 ? t->shape[0] : 0, cols = t->shape[t->n_dims - 1];
            bk_weight *w = load_tensor(h, m, t->name, rows, cols, 1, err, errlen);
            if (!w) return -1;
            m->extra = xrealloc(m->extra, (size_t)(m->n_extra + 1) * sizeof *m->extra);
            m->extra[m->n_extra++] = (model_extra){strdup(t->name), w, rows, cols};
        }
    return 0;
}

static int load_globals(const hf_dir *h, model *m, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    m->tok_embd =
        load_tensor(h, m, "model.embed_tokens.weight", c->vocab, c->d_model, 1, err, errlen);
    m->embd_bytes = m->weight_bytes;
    m->out_norm =
        m->tok_embd ? load_tensor(h, m, "model.norm.weight", 0, c->d_model, 1, err, errlen) : NULL;
    if (!m->out_norm) return -1;
    m->lm_head = c->tied
                     ? m->tok_embd
                     : load_tensor(h, m, "lm_head.weight", c->vocab, c->d_model, 1, err, errlen);
    if (!m->lm_head) return -1;
    m->n_params += (size_t)c->vocab * c->d_model * (c->tied ? 1 : 2) + c->d_model;
    return 0;
}

model *model_load_hf(const hf_dir *h, backend *bk, char *err, size_t errlen) {
    model *m = xcalloc(1, sizeof *m);
    m->bk = bk;
    m->hf = h;
    int rc = model_config_from_hf(h, &m->cfg, err, errlen);
    if (rc == 0) {
        const char *base = strrchr(h->path, '/');
        m->name = strdup(base ? base + 1 : h->path);
        m->layers = xcalloc((size_t)m->cfg.n_layer, sizeof *m->layers);
        rc = load_globals(h, m, err, errlen);
    }
    for (int l = 0; rc == 0 && l < m->cfg.n_layer; l++)
        rc = load_layer(h, m, l, err, errlen);
    if (rc == 0) rc = load_extras(h, m, err, errlen);
    if (rc != 0) {
        model_free(m);
        return NULL;
    }
    model_fuse(m);
    return m;
}

const model_extra *model_find_extra(const model *m, const char *name) {
    for (int i = 0; i < m->n_extra; i++)
        if (strcmp(m->extra[i].name, name) == 0) return &m->extra[i];
    return NULL;
}

const char *model_config_str(const model *m, const char *key) {
    return m->hf ? hf_cfg_str(m->hf, key) : NULL;
}

int model_config_int(const model *m, const char *key, long long *out) {
    return m->hf ? hf_cfg_int(m->hf, key, out) : 1;
}

int model_qkv_missing_from(const model *m) {
    for (int l = 0; l < m->cfg.n_layer; l++)
        if (!m->layers[l].wq) return l;
    return -1;
}
