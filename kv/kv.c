// kv/kv.c — KV cache allocation and byte accounting (see kv.h).
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>

#include "../util/check.h"

enum kv_type kv_native_type(size_t elem_bytes) {
    return elem_bytes == 2 ? KV_BF16 : KV_F32;
}

kv_cache *kv_create(int n_layer, int n_kv_head, int head_dim, const int *caps, size_t elem_bytes,
                    kv_alloc_fn alloc, kv_free_fn free_fn, void *mem_ctx, char *err, size_t errlen) {
    enum kv_type t = kv_native_type(elem_bytes);
    return kv_create_typed(n_layer, n_kv_head, head_dim, caps, elem_bytes, t, t, alloc, free_fn,
                           mem_ctx, err, errlen);
}

kv_cache *kv_create_typed(int n_layer, int n_kv_head, int head_dim, const int *caps,
                          size_t elem_bytes, enum kv_type k_type, enum kv_type v_type,
                          kv_alloc_fn alloc, kv_free_fn free_fn, void *mem_ctx, char *err,
                          size_t errlen) {
    size_t k_row = kv_row_bytes(k_type, head_dim), v_row = kv_row_bytes(v_type, head_dim);
    if (!k_row || !v_row) {
        snprintf(err, errlen, "a %s KV cache needs a head_dim that is a multiple of 32; this "
                 "model's is %d", kv_type_name(k_row ? v_type : k_type), head_dim);
        return NULL;
    }
    kv_cache *kv = calloc(1, sizeof *kv);
    if (kv) kv->layers = calloc((size_t)n_layer, sizeof *kv->layers);
    if (!kv || !kv->layers) {
        free(kv);
        snprintf(err, errlen, "out of memory for the KV cache");
        return NULL;
    }
    kv->n_layer = n_layer;
    kv->elem_bytes = elem_bytes;
    kv->k_type = k_type;
    kv->v_type = v_type;
    kv->alloc = alloc;
    kv->free = free_fn;
    kv->mem_ctx = mem_ctx;
    for (int l = 0; l < n_layer; l++) {
        kv_layer *L = &kv->layers[l];
        size_t rows = (size_t)n_kv_head * (size_t)(caps[l] > 0 ? caps[l] : 1);
        L->cap = caps[l];
        L->n_kv_head = n_kv_head;
        L->head_dim = head_dim;
        L->k_type = k_type, L->v_type = v_type;
        L->k_row = k_row, L->v_row = v_row;
        L->k = alloc(mem_ctx, (rows * k_row + elem_bytes - 1) / elem_bytes);
        L->v = alloc(mem_ctx, (rows * v_row + elem_bytes - 1) / elem_bytes);
        L->pos = malloc((size_t)n_kv_head * (size_t)(caps[l] > 0 ? caps[l] : 1) * sizeof(int));
        if (!L->k || !L->v || !L->pos) {
            snprintf(err, errlen, "out of memory for the KV cache (layer %d, %d entries)", l,
                     caps[l]);
            kv_free(kv);
            return NULL;
        }
    }
    return kv;
}

size_t kv_bytes_for(int n_layer, int n_kv_head, int head_dim, const int *caps, enum kv_type k_type,
                    enum kv_type v_type) {
    size_t b = 0, row = kv_row_bytes(k_type, head_dim) + kv_row_bytes(v_type, head_dim);
    for (int l = 0; l < n_layer; l++) {
        size_t entries = (size_t)n_kv_head * (size_t)(caps[l] > 0 ? caps[l] : 1);
        b += entries * (row + sizeof(int));
    }
    return b;
}

void kv_free(kv_cache *kv) {
    if (!kv) return;
    if (kv->side_free) kv->side_free(kv->side);
    for (int l = 0; l < kv->n_layer; l++) {
        kv_layer *L = &kv->layers[l];
        if (L->k) kv->free(kv->mem_ctx, L->k);
        if (L->v) kv->free(kv->mem_ctx, L->v);
        free(L->pos);
    }
    free(kv->layers);
    free(kv);
}

size_t kv_bytes(const kv_cache *kv) {
    size_t b = 0;
    for (int l = 0; l < kv->n_layer; l++) {
        const kv_layer *L = &kv->layers[l];
        b += (size_t)L->n_kv_head * (size_t)L->cap * (L->k_row + L->v_row);
    }
    return b + kv->side_bytes;
}

void kv_note_append(kv_layer *L, const int *pos, int n) {
    CHECK_INTERNAL(L->len + n <= L->cap, "KV layer overflow: %d + %d > %d", L->len, n, L->cap);
    for (int g = 0; g < L->n_kv_head; g++)
        for (int i = 0; i < n; i++) L->pos[(size_t)g * L->cap + L->len + i] = pos[i];
    L->len += n;
}

long kv_entries(const kv_cache *kv) {
    long n = 0;
    for (int l = 0; l < kv->n_layer; l++) n += kv->layers[l].len;
    return n;
}
