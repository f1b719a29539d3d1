// policies/prompt_cache.c — the --prompt-cache file (format in prompt_cache.h). Parsing checks
// every field and size against the buffer, and the checksum over all of it, before a byte of
// the rows is used.
#include "prompt_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "../util/outfile.h"

#define MAGIC "SIFTKVC"   // 8 bytes with its NUL
#define N_FIELDS 11       // version .. weights_len
#define HEADER (8 + 4 * N_FIELDS + 8)
#define MAX_LAYERS 1024
#define MAX_HEADS 1024
#define MAX_DIM 4096
#define MAX_TOK (1 << 24)

static void put_u32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *b) {
    return b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static void put_u64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

// FNV-1a over 8-byte words (then the tail's bytes): the checksum of a file of hundreds of MB in a
// fraction of a second.
static uint64_t checksum(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) h = (h ^ get_u64(p + i)) * 1099511628211ULL;
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

int pcache_token(const pcache_view *v, int i) { return (int)get_u32(v->tokens + 4 * (size_t)i); }

pcache_meta pcache_meta_of(const context *cx, const char *weights) {
    const model *m = cx->m;
    pcache_meta t = {.digest = m->digest, .n_layer = m->cfg.n_layer, .n_kv_head = m->cfg.n_kv_head,
                     .head_dim = m->cfg.head_dim, .ubatch = cx->p.ubatch};
    enum kv_type k, v;
    fwd_kv_types(cx, &k, &v);
    t.k_type = (int)k, t.v_type = (int)v;
    snprintf(t.model, sizeof t.model, "%s", m->name ? m->name : "?");
    snprintf(t.backend, sizeof t.backend, "%s", m->bk->name);
    snprintf(t.weights, sizeof t.weights, "%s", weights ? weights : "native");
    return t;
}

// Bytes of the rows of n tokens: every layer's K and V rows of every KV head.
static size_t rows_bytes(const pcache_meta *m, size_t k_row, size_t v_row, size_t n) {
    return (size_t)m->n_layer * m->n_kv_head * n * (k_row + v_row);
}

int pcache_parse(const void *buf, size_t len, const char *path, int vocab, pcache_view *v, char *err,
                 size_t errlen) {
    const unsigned char *b = buf;
    *v = (pcache_view){0};
    if (len < HEADER || memcmp(b, MAGIC, 8) != 0)
        return err_printf(err, errlen, "--prompt-cache %s: not a sift prompt cache (no SIFTKVC header)", path) - 1;
    uint32_t f[N_FIELDS];
    for (int i = 0; i < N_FIELDS; i++) f[i] = get_u32(b + 8 + 4 * i);
    if (f[0] != PCACHE_VERSION)
        return err_printf(err, errlen, "--prompt-cache %s: version %u, this sift reads version %d "
                          "(remove the file to make a new one)", path, f[0], PCACHE_VERSION) - 1;
    pcache_meta *m = &v->meta;
    v->version = (int)f[0];
    if (f[1] < 1 || f[1] > MAX_LAYERS || f[2] < 1 || f[2] > MAX_HEADS || f[3] < 1 || f[3] > MAX_DIM ||
        f[4] > KV_Q8_0 || f[5] > KV_Q8_0 || f[6] > MAX_TOK || f[7] < 1 || f[7] > MAX_TOK ||
        f[8] >= sizeof m->model || f[9] >= sizeof m->backend || f[10] >= sizeof m->weights)
        return err_printf(err, errlen, "--prompt-cache %s: damaged header (a field out of range)", path) - 1;
    m->n_layer = (int)f[1], m->n_kv_head = (int)f[2], m->head_dim = (int)f[3];
    m->k_type = (int)f[4], m->v_type = (int)f[5], m->ubatch = (int)f[6];
    v->n_tok = (int)f[7];
    m->digest = get_u64(b + 8 + 4 * N_FIELDS);
    v->k_row = kv_row_bytes((enum kv_type)m->k_type, m->head_dim);
    v->v_row = kv_row_bytes((enum kv_type)m->v_type, m->head_dim);
    if (!v->k_row || !v->v_row)
        return err_printf(err, errlen, "--prompt-cache %s: damaged header (row type and head_dim do "
                          "not fit)", path) - 1;
    size_t names = (size_t)f[8] + f[9] + f[10], toks = 4 * (size_t)v->n_tok;
    size_t rows = rows_bytes(m, v->k_row, v->v_row, (size_t)v->n_tok);
    size_t want = HEADER + names + toks + rows + 8;
    if (len != want)
        return err_printf(err, errlen, "--prompt-cache %s: %zu bytes where its header says %zu "
                          "(truncated or damaged)", path, len, want) - 1;
    if (get_u64(b + len - 8) != checksum(b, len - 8))
        return err_printf(err, errlen, "--prompt-cache %s: checksum mismatch (the file is damaged)", path) - 1;
    const unsigned char *p = b + HEADER;
    memcpy(m->model, p, f[8]), p += f[8];
    memcpy(m->backend, p, f[9]), p += f[9];
    memcpy(m->weights, p, f[10]), p += f[10];
    v->tokens = p, p += toks;
    v->rows = p;
    return vocab > 0 ? pcache_check_tokens(v, vocab, path, err, errlen) : 0;
}

int pcache_check_tokens(const pcache_view *v, int vocab, const char *path, char *err, size_t errlen) {
    for (int i = 0; i < v->n_tok; i++) {
        uint32_t t = get_u32(v->tokens + 4 * (size_t)i);
        if (t >= (uint32_t)vocab)
            return err_printf(err, errlen, "--prompt-cache %s: token %d is %u, beyond the vocabulary "
                              "of %d (a damaged file)", path, i, t, vocab) - 1;
    }
    return 0;
}

int pcache_match(const pcache_view *v, const pcache_meta *w, const char *path, char *err,
                 size_t errlen) {
    const pcache_meta *m = &v->meta;
    if (m->digest != w->digest || m->n_layer != w->n_layer || m->n_kv_head != w->n_kv_head ||
        m->head_dim != w->head_dim)
        return err_printf(err, errlen, "--prompt-cache %s was made by another model ('%s'; this run's "
                          "is '%s'): remove it or give another file", path, m->model, w->model) - 1;
    if (strcmp(m->backend, w->backend) || strcmp(m->weights, w->weights))
        return err_printf(err, errlen, "--prompt-cache %s was made on %s with --weights %s; this run "
                          "is on %s with --weights %s", path, m->backend, m->weights, w->backend,
                          w->weights) - 1;
    if (m->k_type != w->k_type || m->v_type != w->v_type)
        return err_printf(err, errlen, "--prompt-cache %s holds K %s, V %s rows; this run's cache is K "
                          "%s, V %s (--cache-type-k/-v)", path, kv_type_name((enum kv_type)m->k_type),
                          kv_type_name((enum kv_type)m->v_type), kv_type_name((enum kv_type)w->k_type),
                          kv_type_name((enum kv_type)w->v_type)) - 1;
    if (m->ubatch != w->ubatch)
        return err_printf(err, errlen, "--prompt-cache %s was made with --ubatch %d; this run's is %d "
                          "(its rows would round otherwise)", path, m->ubatch, w->ubatch) - 1;
    return 0;
}

int pcache_save(const char *path, const pcache_meta *meta, const context *cx, kv_cache *kv,
                const int *ids, int n, char *err, size_t errlen) {
    const kv_layer *L0 = &kv->layers[0];
    size_t k_row = L0->k_row, v_row = L0->v_row;
    size_t nm = strlen(meta->model), nb = strlen(meta->backend), nw = strlen(meta->weights);
    size_t per_k = (size_t)meta->n_kv_head * n * k_row, per_v = (size_t)meta->n_kv_head * n * v_row;
    size_t len = HEADER + nm + nb + nw + 4 * (size_t)n + rows_bytes(meta, k_row, v_row, (size_t)n) + 8;
    unsigned char *b = malloc(len);
    if (!b) return err_printf(err, errlen, "--prompt-cache %s: out of memory for %zu bytes", path, len) - 1;
    memcpy(b, MAGIC, 8);
    uint32_t f[N_FIELDS] = {PCACHE_VERSION, (uint32_t)meta->n_layer, (uint32_t)meta->n_kv_head,
                            (uint32_t)meta->head_dim, (uint32_t)meta->k_type, (uint32_t)meta->v_type,
                            (uint32_t)meta->ubatch, (uint32_t)n, (uint32_t)nm, (uint32_t)nb, (uint32_t)nw};
    for (int i = 0; i < N_FIELDS; i++) put_u32(b + 8 + 4 * i, f[i]);
    put_u64(b + 8 + 4 * N_FIELDS, meta->digest);
    unsigned char *p = b + HEADER;
    memcpy(p, meta->model, nm), p += nm;
    memcpy(p, meta->backend, nb), p += nb;
    memcpy(p, meta->weights, nw), p += nw;
    for (int i = 0; i < n; i++) put_u32(p + 4 * (size_t)i, (uint32_t)ids[i]);
    p += 4 * (size_t)n;
    for (int l = 0; l < meta->n_layer; l++, p += per_k + per_v)
        if (fwd_kv_read(cx, kv, l, n, p, p + per_k, err, errlen) != 0) {
            free(b);
            return -1;
        }
    put_u64(b + len - 8, checksum(b, len - 8));
    char why[512];
    int rc = outfile_write(path, (const char *)b, len, "--prompt-cache", why, sizeof why);
    if (rc) err_printf(err, errlen, "%s", why);
    free(b);
    return rc ? -1 : 0;
}

kv_prefix *pcache_prefix(context *cx, const pcache_view *v, int n, char *err, size_t errlen) {
    const pcache_meta *m = &v->meta;
    CHECK_INTERNAL(n >= 1 && n <= v->n_tok, "a prefix of %d of a file's %d tokens", n, v->n_tok);
    double t0 = now_ms();
    size_t per_k = (size_t)m->n_kv_head * v->n_tok * v->k_row, per_v = (size_t)m->n_kv_head * v->n_tok * v->v_row;
    const void **k = xmalloc((size_t)m->n_layer * sizeof *k), **vv = xmalloc((size_t)m->n_layer * sizeof *vv);
    unsigned char *packed = NULL;   // the first n rows of each head, when n < n_tok
    if (n < v->n_tok)
        packed = xmalloc((size_t)m->n_layer * m->n_kv_head * n * (v->k_row + v->v_row));
    for (int l = 0; l < m->n_layer; l++) {
        const unsigned char *lk = v->rows + (size_t)l * (per_k + per_v), *lv = lk + per_k;
        if (!packed) {
            k[l] = lk, vv[l] = lv;
            continue;
        }
        unsigned char *pk = packed + (size_t)l * m->n_kv_head * n * (v->k_row + v->v_row);
        unsigned char *pv = pk + (size_t)m->n_kv_head * n * v->k_row;
        for (int g = 0; g < m->n_kv_head; g++) {
            memcpy(pk + (size_t)g * n * v->k_row, lk + (size_t)g * v->n_tok * v->k_row, (size_t)n * v->k_row);
            memcpy(pv + (size_t)g * n * v->v_row, lv + (size_t)g * v->n_tok * v->v_row, (size_t)n * v->v_row);
        }
        k[l] = pk, vv[l] = pv;
    }
    kv_cache *kv = fwd_kv_write(cx, n, k, vv, err, errlen);
    free(k), free(vv), free(packed);
    if (!kv) return NULL;
    kv_prefix *p = xcalloc(1, sizeof *p);
    p->kv = kv, p->n = n;
    p->ids = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) p->ids[i] = pcache_token(v, i);
    p->ms = now_ms() - t0;
    return p;
}
