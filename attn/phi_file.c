// attn/phi_file.c — the .phi file: fitted feature maps next to the model (format in phi.h).
// Parsing validates every field and size against the buffer before touching the parameters.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "../util/outfile.h"
#include "phi.h"

#define PHI_MAGIC "SIFTPHI"   // 8 bytes with its NUL
#define PHI_VERSION 1
#define PHI_N_FIELDS 10       // version, kind, n_layer, n_head, n_kv_head, d_in, d_emb, d_hid, d_phi, n_ctx
#define PHI_HEADER (8 + 4 * PHI_N_FIELDS)
#define PHI_MAX_DIM 4096
#define PHI_MAX_LAYERS 512
#define PHI_MAX_CTX (1u << 26)

static void put_u32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *b) {
    return b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static size_t n_floats(const phi_maps *p) {
    return (size_t)p->n_layer * (p->n_head + p->n_kv_head) * (size_t)phi_n_par(p);
}

int phi_maps_save(const phi_maps *p, const char *path, char *err, size_t errlen) {
    unsigned char h[PHI_HEADER] = {0};
    memcpy(h, PHI_MAGIC, 8);
    uint32_t f[PHI_N_FIELDS] = {PHI_VERSION, (uint32_t)p->kind, (uint32_t)p->n_layer,
                                (uint32_t)p->n_head, (uint32_t)p->n_kv_head, (uint32_t)p->d_in,
                                (uint32_t)p->d_emb, (uint32_t)p->d_hid, (uint32_t)p->d_phi,
                                (uint32_t)p->n_ctx};
    for (int i = 0; i < PHI_N_FIELDS; i++) put_u32(h + 8 + 4 * i, f[i]);
    size_t nq = (size_t)p->n_layer * p->n_head * phi_n_par(p), nk = n_floats(p) - nq;
    size_t vlen = strnlen(p->verdict, sizeof p->verdict - 1);
    unsigned char vh[4];
    put_u32(vh, (uint32_t)vlen);
    // built in memory, then written whole (a fit-phi run killed mid-save leaves the old maps)
    outbuf b;
    FILE *fp = outbuf_open(&b);
    fwrite(h, 1, sizeof h, fp);
    fwrite(p->q, 4, nq, fp);
    fwrite(p->k, 4, nk, fp);
    if (vlen) fwrite(vh, 1, 4, fp), fwrite(p->verdict, 1, vlen, fp);
    return outbuf_write(&b, path, "phi file", err, errlen);
}

// Header fields in range for the kind; 0 or -1 with err.
static int check_shape(const phi_maps *s, const char *name, char *err, size_t errlen) {
    int mlp = s->kind == PHI_MLP;
    if (s->kind != PHI_MLP && s->kind != PHI_PRF)
        return err_printf(err, errlen, "phi file '%s': unknown map kind %d", name, s->kind);
    if (s->n_layer < 1 || s->n_layer > PHI_MAX_LAYERS || s->n_head < 1 ||
        s->n_head > PHI_MAX_DIM || s->n_kv_head < 1 || s->n_head % s->n_kv_head != 0)
        return err_printf(err, errlen, "phi file '%s': bad shape %d layers, %d/%d heads", name,
                          s->n_layer, s->n_head, s->n_kv_head);
    int dims[] = {s->d_in, s->d_phi, mlp ? s->d_emb : 1, mlp ? s->d_hid : 1};
    for (int i = 0; i < 4; i++)
        if (dims[i] < 1 || dims[i] > PHI_MAX_DIM)
            return err_printf(err, errlen, "phi file '%s': dimension %d outside [1, %d]", name,
                              dims[i], PHI_MAX_DIM);
    if (!mlp && (s->d_emb != 0 || s->d_hid != 0))
        return err_printf(err, errlen, "phi file '%s': random features with MLP sizes", name);
    return 0;
}

phi_maps *phi_maps_parse(const void *buf, size_t len, const char *name, char *err, size_t errlen) {
    const unsigned char *b = buf;
    if (len < PHI_HEADER || memcmp(b, PHI_MAGIC, 8) != 0) {
        err_printf(err, errlen, "'%s' is not a phi file (no SIFTPHI header)", name);
        return NULL;
    }
    uint32_t f[PHI_N_FIELDS];
    for (int i = 0; i < PHI_N_FIELDS; i++) f[i] = get_u32(b + 8 + 4 * i);
    if (f[0] != PHI_VERSION) {
        err_printf(err, errlen, "phi file '%s' has version %u; this sift reads version %d", name,
                   f[0], PHI_VERSION);
        return NULL;
    }
    for (int i = 1; i < PHI_N_FIELDS; i++)
        if (f[i] > (i == PHI_N_FIELDS - 1 ? PHI_MAX_CTX : PHI_MAX_DIM)) {
            err_printf(err, errlen, "phi file '%s': header field %d = %u out of range", name, i, f[i]);
            return NULL;
        }
    phi_maps s = {(int)f[1], (int)f[2], (int)f[3], (int)f[4], (int)f[5], (int)f[6], (int)f[7],
                  (int)f[8], NULL, NULL, 0, ""};
    if (check_shape(&s, name, err, errlen) != 0) return NULL;
    size_t want = PHI_HEADER + 4 * n_floats(&s), vlen = 0;
    if (len >= want + 4) {   // the optional verdict: u32 length, printable ASCII
        vlen = get_u32(b + want);
        if (vlen < 1 || vlen >= sizeof ((phi_maps *)0)->verdict || len != want + 4 + vlen) {
            err_printf(err, errlen, "phi file '%s': bad verdict record after the parameters", name);
            return NULL;
        }
        for (size_t i = 0; i < vlen; i++)
            if (b[want + 4 + i] < 0x20 || b[want + 4 + i] > 0x7e) {
                err_printf(err, errlen, "phi file '%s': verdict is not printable text", name);
                return NULL;
            }
    } else if (len != want) {
        err_printf(err, errlen, "phi file '%s' is %zu bytes; its header says %zu", name, len, want);
        return NULL;
    }
    phi_maps *p = phi_maps_alloc(&s);
    p->n_ctx = (int)f[9];
    if (vlen) memcpy(p->verdict, b + want + 4, vlen);
    size_t nq = (size_t)s.n_layer * s.n_head * phi_n_par(&s);
    memcpy(p->q, b + PHI_HEADER, 4 * nq);
    memcpy(p->k, b + PHI_HEADER + 4 * nq, 4 * (n_floats(&s) - nq));
    for (size_t i = 0; i < n_floats(&s); i++)
        if (!isfinite(i < nq ? p->q[i] : p->k[i - nq])) {
            err_printf(err, errlen, "phi file '%s': parameter %zu is not finite", name, i);
            phi_maps_free(p);
            return NULL;
        }
    return p;
}

phi_maps *phi_maps_load(const char *path, char *err, size_t errlen) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        err_printf(err, errlen, "cannot open phi file '%s': %s", path, strerror(errno));
        return NULL;
    }
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    if (len < 0 || (unsigned long)len > ((size_t)1 << 34)) {
        fclose(fp);
        err_printf(err, errlen, "phi file '%s': unreadable size", path);
        return NULL;
    }
    unsigned char *buf = xmalloc((size_t)len + 1);
    size_t got = fread(buf, 1, (size_t)len, fp);
    fclose(fp);
    phi_maps *p = got == (size_t)len ? phi_maps_parse(buf, (size_t)len, path, err, errlen) : NULL;
    if (got != (size_t)len) err_printf(err, errlen, "cannot read phi file '%s'", path);
    free(buf);
    return p;
}
