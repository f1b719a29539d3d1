// kv/kv.c — KV cache allocation and byte accounting (see kv.h).
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>

#include "../util/check.h"

kv_cache *kv_create(int n_layer, int n_kv_head, int head_dim, const int *caps, size_t elem_bytes,
                    kv_alloc_fn alloc, kv_free_fn free_fn, void *mem_ctx, char *err, size_t errlen) {
    kv_cache *kv = calloc(1, sizeof *kv);
    if (kv) kv->layers = calloc((size_t)n_layer, sizeof *kv->layers);
    if (!kv || !kv->layers) {
        free(kv);
        snprintf(err, errlen, "out of memory for the KV cache");
        return NULL;
    }
    kv->n_layer = n_layer;
    kv->elem_bytes = elem_bytes;
    kv->alloc = alloc;
    kv->free = free_fn;
    kv->mem_ctx = mem_ctx;
    for (int l = 0; l < n_layer; l++) {
        kv_layer *L = &kv->layers[l];
        size_t n = (size_t)n_kv_head * (size_t)(caps[l] > 0 ? caps[l] : 1) * (size_t)head_dim;
        L->cap = caps[l];
        L->n_kv_head = n_kv_head;
        L->head_dim = head_dim;
        L->k = alloc(mem_ctx, n);
        L->v = alloc(mem_ctx, n);
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

size_t kv_bytes_for(int n_layer, int n_kv_head, int head_dim, const int *caps, size_t elem_bytes) {
    size_t b = 0;
    for (int l = 0; l < n_layer; l++) {
        size_t entries = (size_t)n_kv_head * (size_t)(caps[l] > 0 ? caps[l] : 1);
        b += entries * (2 * (size_t)head_dim * elem_bytes + sizeof(int));
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
        b += 2 * (size_t)L->n_kv_head * (size_t)L->cap * (size_t)L->head_dim * kv->elem_bytes;
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
