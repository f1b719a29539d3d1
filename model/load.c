// model/load.c — the one loader (load.h): format dispatch, the memory plan, the weights, the
// tokenizers and the run contexts.
#include "load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "../weights/dequant.h"
#include "../weights/hf.h"
#include "../weights/synthetic.h"
#include "cost.h"

static int is_synthetic(const char *path) { return strncmp(path, SYNTH_PREFIX, strlen(SYNTH_PREFIX)) == 0; }

// FNV-1a, 64 bits, over n bytes, continuing h.
static unsigned long long fnv_bytes(unsigned long long h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

// A file's fingerprint, continuing h: its size, its first `head` bytes (a GGUF's whole header:
// metadata and tensor table) and 4 KiB at 64 places spread through the rest (the weights, sampled:
// reading a file of gigabytes whole would cost seconds).
static unsigned long long file_digest(unsigned long long h, const unsigned char *map, size_t size,
                                      size_t head) {
    h = fnv_bytes(h, &size, sizeof size);
    if (head > size) head = size;
    h = fnv_bytes(h, map, head);
    for (int i = 0; i < 64 && size > head; i++) {
        size_t at = head + (size - head) / 64 * (size_t)i, n = size - at < 4096 ? size - at : 4096;
        h = fnv_bytes(h, map + at, n);
    }
    return h;
}

int load_config(const char *p, model_config *c, char *err, size_t errlen) {
    synth_shape s;
    int rc = -1;
    if (is_synthetic(p)) {
        if ((rc = synth_parse(p, &s, err, errlen)) == 0) model_config_synth(&s, c);
    } else if (hf_is_dir(p)) {
        char why[400];
        hf_dir *h = hf_open(p, why, sizeof why);
        if (!h) snprintf(err, errlen, "%s", why);
        else if ((rc = model_config_from_hf(h, c, why, sizeof why)) != 0)
            snprintf(err, errlen, "%s: %s", p, why);
        hf_close(h);
    } else {
        char why[400];
        gguf_file *f = gguf_open(p, why, sizeof why);
        if (!f) snprintf(err, errlen, "%s", why);
        else if ((rc = model_config_from_gguf(f, c, why, sizeof why)) != 0)
            snprintf(err, errlen, "%s: %s", p, why);
        gguf_close(f);
    }
    return rc;
}

// Every matrix of c has whole blocks of wtype along its rows; 0, or -1 + err.
static int synth_wtype_check(const model_config *c, uint32_t wtype, char *err, size_t errlen) {
    int widths[] = {c->d_model, c->n_head * c->head_dim, c->d_ff};
    for (int i = 0; i < 3; i++)
        if (dq_bytes(wtype, (uint64_t)widths[i]) == 0)
            return err_printf(err, errlen, "--wtype %s needs rows that are whole blocks of %llu "
                              "elements; this shape has rows of %d", gguf_type_name(wtype),
                              (unsigned long long)dq_block_elems(wtype), widths[i]);
    return 0;
}

// Resident bytes of a synthetic model's weights on bk: the matrices as `wtype` blocks (or fp32
// values), the vectors (norms, biases) fp32.
static double synth_weight_bytes(backend *bk, const model_config *c, uint32_t wtype) {
    double vec = (2.0 * c->n_layer + 1) * c->d_model +
                 (c->qkv_bias ? (double)c->n_layer * (c->n_head + 2 * c->n_kv_head) * c->head_dim : 0);
    double mat = cost_n_params(c) - vec;
    bk_tensor probe = {wtype, NULL, 256, (size_t)c->d_model, 0};
    double per = bk->weight_bytes ? (double)bk->weight_bytes(bk, probe) / (256.0 * c->d_model)
                                  : (double)bk->elem_bytes;
    bk_tensor vprobe = {GGML_F32, NULL, 0, (size_t)c->d_model, 0};
    double per_vec = bk->weight_bytes ? (double)bk->weight_bytes(bk, vprobe) / c->d_model
                                      : (double)bk->elem_bytes;
    return mat * per + vec * per_vec;
}

// Makes synthetic:NAME[@SEED] on L->bk, refusing up front weights that would not fit in the
// memory the backend says is available; its line into L->note. 0 or -1 + err.
// A synthetic model `path` on bk (weights of wtype), its description in note; NULL + err.
static model *synth_load(const char *path, backend *bk, uint32_t wtype, char *note, size_t note_len,
                         char *err, size_t errlen) {
    char why[400];
    synth_shape s;
    if (synth_parse(path, &s, err, errlen) != 0) return NULL;
    s.wtype = wtype;
    model_config c;
    model_config_synth(&s, &c);
    if (synth_wtype_check(&c, wtype, why, sizeof why) != 0) {
        free(c.inv_freq);
        err_printf(err, errlen, "%s: %s", path, why);
        return NULL;
    }
    double params = cost_n_params(&c), bytes = synth_weight_bytes(bk, &c, wtype);
    double avail = bk->mem_available ? (double)bk->mem_available(bk) : -1;
    free(c.inv_freq);
    snprintf(note, note_len, "synthetic %s (seed %llu, %s): %.1fM params, %.2f GiB of weights on %s",
             s.name, (unsigned long long)s.seed, gguf_type_name(wtype), params / 1e6,
             bytes / 1073741824.0, bk->name);
    if (avail > 0 && bytes > avail) {
        err_printf(err, errlen, "%s needs %.2f GiB for its weights on %s (%s) but only %.2f GiB of "
                   "memory is available", path, bytes / 1073741824.0, bk->name,
                   gguf_type_name(wtype), avail / 1073741824.0);
        return NULL;
    }
    model *m = model_load_synth(&s, bk, why, sizeof why);
    if (!m) err_printf(err, errlen, "%s: %s", path, why);
    else m->digest = fnv_bytes(fnv_bytes(fnv_bytes(1469598103934665603ULL, s.name, strlen(s.name)),
                                         &s.seed, sizeof s.seed), &wtype, sizeof wtype);
    return m;
}

// A synthetic model and, with --draft, a synthetic draft (`sift bench`'s speculator at real
// shapes: neither has a tokenizer, so the draft must be synthetic too and have the model's
// vocabulary, which the random prompt tokens are drawn from). 0, or -1 + err.
static int load_synthetic(loaded *L, const char *draft_path, uint32_t wtype, char *err, size_t errlen) {
    if (draft_path && !is_synthetic(draft_path))
        return err_printf(err, errlen, "--draft %s: a synthetic model has no tokenizer to match a "
                          "draft file's; use a synthetic draft (--draft synthetic:NAME) or "
                          "--draft-layers", draft_path);
    if (!(L->m = synth_load(L->path, L->bk, wtype, L->note, sizeof L->note, err, errlen))) return -1;
    if (!draft_path) return 0;
    synth_shape s;   // the vocabulary first, before any weight is made
    model_config dc;
    if (synth_parse(draft_path, &s, err, errlen) != 0) return -1;
    model_config_synth(&s, &dc);
    free(dc.inv_freq);
    if (dc.vocab != L->m->cfg.vocab)
        return err_printf(err, errlen, "--draft %s has a vocabulary of %d tokens, the model %d: a "
                          "draft must share the model's", draft_path, dc.vocab, L->m->cfg.vocab);
    char note[256];
    if (!(L->draft = synth_load(draft_path, L->bk, wtype, note, sizeof note, err, errlen))) return -1;
    size_t used = strlen(L->note);
    snprintf(L->note + used, sizeof L->note - used, "; draft: %s", note);
    return 0;
}

// Resident bytes of every 2-D or 1-D tensor of the file on bk (`native`: as stored, for the
// hint), summed.
static void gguf_weight_bytes(const gguf_file *f, backend *bk, double *on_bk, double *as_stored) {
    *on_bk = *as_stored = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        size_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        bk_tensor bt = {t->type, t->data, rows > 1 ? rows : 0, t->ne[0], 0};
        *as_stored += (double)t->nbytes;
        *on_bk += bk->weight_bytes ? (double)bk->weight_bytes(bk, bt)
                                   : (double)(rows * t->ne[0] * bk->elem_bytes);
    }
}

static void hf_weight_bytes(const hf_dir *h, backend *bk, double *on_bk, double *as_stored) {
    *on_bk = *as_stored = 0;
    for (int s = 0; s < h->n_shards; s++)
        for (size_t i = 0; i < h->shards[s]->n_tensors; i++) {
            const st_tensor *t = &h->shards[s]->tensors[i];
            if (t->ggml_type == UINT32_MAX || t->n_dims < 1) continue;
            size_t cols = t->shape[t->n_dims - 1], rows = cols ? t->n_elems / cols : 0;
            bk_tensor bt = {t->ggml_type, t->data, rows > 1 ? rows : 0, cols, 0};
            *as_stored += (double)t->nbytes;
            *on_bk += bk->weight_bytes ? (double)bk->weight_bytes(bk, bt)
                                       : (double)(t->n_elems * bk->elem_bytes);
        }
}

#define TO_GIB(x) ((x) / 1073741824.0)

int load_weight_bytes(const char *path, const char *device, enum bk_weights w, uint32_t wtype,
                      double *bytes, char *err, size_t errlen) {
    backend *bk;
    if (device && strcmp(device, "cuda") == 0) {
#ifdef SIFT_CUDA
        bk = backend_cuda_plan();
#else
        snprintf(err, errlen, "this sift has no CUDA backend to plan for (built without nvcc)");
        return -1;
#endif
    } else {
        bk = backend_cpu_create(0, w);
    }
    const char *p = path;
    double stored;
    int rc = -1;
    if (is_synthetic(p)) {
        synth_shape s;
        model_config c;
        if (synth_parse(p, &s, err, errlen) == 0) {
            model_config_synth(&s, &c);
            *bytes = synth_weight_bytes(bk, &c, wtype);
            rc = synth_wtype_check(&c, wtype, err, errlen);
            free(c.inv_freq);
        }
    } else if (hf_is_dir(p)) {
        hf_dir *h = hf_open(p, err, errlen);
        if (h) hf_weight_bytes(h, bk, bytes, &stored), rc = 0;
        hf_close(h);
    } else {
        gguf_file *f = gguf_open(p, err, errlen);
        if (f) gguf_weight_bytes(f, bk, bytes, &stored), rc = 0;
        gguf_close(f);
    }
    bk->destroy(bk);
    return rc;
}

// The memory plan, before any weight is allocated: the weights as bk keeps them, plus with
// ctx > 0 the KV cache of ctx tokens and the activations of a prefill pass of `rows` rows
// (model/cost.h: rows = ctx for a one-pass prefill, min(ctx, --ubatch) for a chunked one),
// against what bk can still allocate. 0, or -1 with one line naming the numbers and what
// would fit (chunk_rows > 0: every strategy asked for can run in chunks, so --ubatch is a way
// out).
// The KV cache counts the context's row types (--cache-type-k/-v).
static int plan_memory(const load_req *r, const model_config *c, double weights, double as_stored,
                       char *err, size_t errlen) {
    backend *bk = r->bk;
    int ctx = r->plan_ctx;
    long rows = r->plan_rows, U = ctx < r->chunk_rows ? ctx : r->chunk_rows;
    enum kv_type kt, vt;
    ctx_kv_types(&r->cp, bk, &kt, &vt);
    double avail = bk->mem_available ? (double)bk->mem_available(bk) : 0;
    double kv_tok = cost_kv_token_bytes_typed(c, kt, vt);
    size_t e = bk->elem_bytes;
    double rest = ctx > 0 ? cost_prefill_mem_bytes_rows(c, ctx, 0, rows, e, kv_tok) : 0;
    if (avail <= 0 || weights + rest <= avail) return 0;
    char parts[240], hint[160];
    snprintf(parts, sizeof parts, "weights %.2f GiB", TO_GIB(weights));
    if (ctx > 0)
        snprintf(parts + strlen(parts), sizeof parts - strlen(parts),
                 " + KV cache (K %s, V %s: %.2f GiB) and activations (%ld rows) for -c %d: %.2f GiB",
                 kv_type_name(kt), kv_type_name(vt), TO_GIB(ctx * kv_tok), rows, ctx,
                 TO_GIB(rest));
    // per token of -c: its KV, and its activations while a pass holds every row (rows == ctx)
    double fixed = (double)c->vocab * e, act_row = cost_prefill_mem_bytes_rows(c, 0, 0, 1, e, 0) - fixed;
    double per_tok = kv_tok + (rows < ctx ? 0 : act_row);
    if (rows < ctx) fixed += rows * act_row;   // a chunk's activations, whatever -c
    double q8_tok = cost_kv_token_bytes_typed(c, KV_Q8_0, KV_Q8_0);
    if (ctx > 0 && U > 0 && rows > U &&
        weights + cost_prefill_mem_bytes_rows(c, ctx, 0, U, e, kv_tok) <= avail)
        snprintf(hint, sizeof hint, "; --ubatch %ld would fit", r->chunk_rows);
    else if (ctx > 0 && q8_tok > 0 && q8_tok < kv_tok && strcmp(bk->name, "cpu") == 0 &&
        weights + cost_prefill_mem_bytes_rows(c, ctx, 0, rows, e, q8_tok) <= avail)
        snprintf(hint, sizeof hint, "; --cache-type-k q8_0 --cache-type-v q8_0 would fit");
    else if (weights + fixed < avail && ctx > 0)
        snprintf(hint, sizeof hint, "; -c %ld would fit", (long)((avail - weights - fixed) / per_tok));
    else if (as_stored + rest < avail && as_stored < weights && strcmp(bk->name, "cpu") == 0)
        snprintf(hint, sizeof hint, "; --weights native (%.2f GiB) would fit", TO_GIB(as_stored));
    else
        snprintf(hint, sizeof hint, "; the weights alone do not fit (a smaller quantisation%s)",
                 strcmp(bk->name, "cpu") ? "" : " or a GPU");
    // (a message longer than err is cut: the return value is looked at, so GCC's truncation
    // warning, which the sanitized -O1 build raises here, does not apply)
    if (snprintf(err, errlen, "needs %.2f GiB on %s (%s) but %.2f GiB is available%s",
                 TO_GIB(weights + rest), bk->name, parts, TO_GIB(avail), hint) < 0)
        err[0] = 0;
    return -1;
}

// The model and its tokenizer at L->path: a Hugging Face directory or a GGUF file, after the
// memory plan (see plan_memory). 0 or -1 + err.
static int load_model(loaded *L, const load_req *r, char *err, size_t errlen) {
    char why[400] = "";
    model_config c;
    double on_bk = 0, stored = 0;
    int have_cfg;
    if (hf_is_dir(L->path)) {
        if (!(L->hf = hf_open(L->path, err, errlen))) return -1;
        if ((L->t = tok_load_hf(L->path, err, errlen)) == NULL) return -1;
        if ((have_cfg = model_config_from_hf(L->hf, &c, why, sizeof why) == 0))
            hf_weight_bytes(L->hf, L->bk, &on_bk, &stored);
    } else {
        if (!(L->f = gguf_open(L->path, err, errlen))) return -1;
        L->t = tok_load_gguf(L->f, why, sizeof why);
        if ((have_cfg = L->t && model_config_from_gguf(L->f, &c, why, sizeof why) == 0))
            gguf_weight_bytes(L->f, L->bk, &on_bk, &stored);
    }
    if (have_cfg) {   // a config that does not parse is reported by the load below
        int rc = plan_memory(r, &c, on_bk, stored, why, sizeof why);
        free(c.inv_freq);
        if (rc) {
            snprintf(err, errlen, "%s: %s", L->path, why);
            return -1;
        }
    }
    if (L->hf) L->m = model_load_hf(L->hf, L->bk, why, sizeof why);
    else L->m = L->t ? model_load_gguf(L->f, L->bk, why, sizeof why) : NULL;
    if (!L->m) snprintf(err, errlen, "%s: %s", L->path, why);
    if (L->m && L->f) L->m->digest = file_digest(1469598103934665603ULL, L->f->map, L->f->size, L->f->data_offset);
    for (int i = 0; L->m && L->hf && i < L->hf->n_shards; i++)
        L->m->digest = file_digest(i ? L->m->digest : 1469598103934665603ULL, L->hf->shards[i]->map,
                                   L->hf->shards[i]->size, 1 << 20);
    return L->m ? 0 : -1;
}

// Loads --draft: a model with exactly the main model's vocabulary. NULL + err otherwise.
static model *load_draft(const char *path, const tok *main_tok, backend *bk, gguf_file **df,
                         tok **dt, char *err, size_t errlen) {
    char why[400];
    *df = gguf_open(path, why, sizeof why);
    *dt = *df ? tok_load_gguf(*df, why, sizeof why) : NULL;
    if (!*dt) {
        snprintf(err, errlen, "--draft %s: %s", path, why);
        return NULL;
    }
    if (tok_n_vocab(*dt) != tok_n_vocab(main_tok)) {
        snprintf(err, errlen, "--draft %s: vocabulary of %d token%s, the main model has %d "
                 "(a draft must share the tokenizer)", path, tok_n_vocab(*dt), plural_s(tok_n_vocab(*dt)),
                 tok_n_vocab(main_tok));
        return NULL;
    }
    for (int id = 0; id < tok_n_vocab(main_tok); id++) {
        size_t a, b;
        const char *pa = tok_piece(main_tok, id, 1, &a), *pb = tok_piece(*dt, id, 1, &b);
        if (a != b || memcmp(pa, pb, a) != 0) {
            snprintf(err, errlen, "--draft %s: token %d differs from the main model's "
                     "(a draft must share the tokenizer)", path, id);
            return NULL;
        }
    }
    model *d = model_load_gguf(*df, bk, why, sizeof why);
    if (!d) snprintf(err, errlen, "--draft %s: %s", path, why);
    return d;
}

// The context over m (NULL: none) for r, refused (-2 + err) when m's head_dim does not take the
// KV row types asked for.
static int make_context(const load_req *r, const char *path, model *m, context **cx, char *err,
                        size_t errlen) {
    if (!m) return 0;
    enum kv_type t[2];
    ctx_kv_types(&r->cp, r->bk, &t[0], &t[1]);
    for (int i = 0; i < 2; i++)
        if (kv_row_bytes(t[i], m->cfg.head_dim) == 0)
            return err_printf(err, errlen, "--cache-type-%c %s needs a head_dim that is a multiple "
                              "of 32; %s has %d", i ? 'v' : 'k', kv_type_name(t[i]), path,
                              m->cfg.head_dim) - 1;
    *cx = ctx_new(m, &r->cp);
    return 0;
}

int load_open(loaded *L, const load_req *r, char *err, size_t errlen) {
    *L = (loaded){.path = strdup(r->path), .bk = r->bk};
    if (is_synthetic(L->path)) {
        if (load_synthetic(L, r->draft_path, r->synth_wtype, err, errlen) != 0) return -1;
    } else {
        if (load_model(L, r, err, errlen) != 0) return -1;
        if (tok_n_vocab(L->t) > L->m->cfg.vocab)
            return err_printf(err, errlen, "%s: tokenizer has %d token%s but the embedding only %d "
                              "row%s", L->path, tok_n_vocab(L->t), plural_s(tok_n_vocab(L->t)),
                              L->m->cfg.vocab, plural_s(L->m->cfg.vocab));
        if (r->draft_path &&
            !(L->draft = load_draft(r->draft_path, L->t, L->bk, &L->df, &L->dt, err, errlen)))
            return -1;
    }
    if (make_context(r, L->path, L->m, &L->cx, err, errlen) ||
        make_context(r, L->path, L->draft, &L->dcx, err, errlen))
        return -2;
    return 0;
}

void load_close(loaded *L) {
    ctx_free(L->cx);
    ctx_free(L->dcx);
    model_free(L->m);
    model_free(L->draft);
    tok_free(L->t);
    tok_free(L->dt);
    gguf_close(L->f);
    gguf_close(L->df);
    hf_close(L->hf);
    free(L->path);
    *L = (loaded){0};
}
