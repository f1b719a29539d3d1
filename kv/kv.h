// kv/kv.h — the KV cache. Each layer has its own capacity and length; K and V are dense
// (n_kv_head, cap, head_dim) in backend memory, keys stored post-RoPE; every entry remembers its
// original absolute position per KV head (pos, host memory), so a layer may keep different
// tokens per head and attention masks by position, not by index. Bytes are counted exactly.
#pragma once
#include <stddef.h>

typedef struct kv_layer {
    int cap, len;              // entries per KV head
    int n_kv_head, head_dim;
    void *k, *v;               // (n_kv_head, cap, head_dim) backend elements
    int *pos;                  // (n_kv_head, cap) original positions
} kv_layer;

typedef void *(*kv_alloc_fn)(void *ctx, size_t n_elems);
typedef void (*kv_free_fn)(void *ctx, void *p);

typedef struct kv_cache {
    int n_layer;
    kv_layer *layers;
    size_t elem_bytes;
    kv_alloc_fn alloc;
    kv_free_fn free;
    void *mem_ctx;
    // Optional side data a strategy attaches (decode summaries): freed by kv_free with
    // side_free, its side_bytes counted by kv_bytes.
    void *side;
    void (*side_free)(void *side);
    size_t side_bytes;
} kv_cache;

// caps[l] = capacity of layer l in entries. NULL (and a message) when memory runs out.
kv_cache *kv_create(int n_layer, int n_kv_head, int head_dim, const int *caps, size_t elem_bytes,
                    kv_alloc_fn alloc, kv_free_fn free, void *mem_ctx, char *err, size_t errlen);
void kv_free(kv_cache *kv);
// Bytes kv_create would take for these capacities: K and V (elem_bytes each) plus positions.
size_t kv_bytes_for(int n_layer, int n_kv_head, int head_dim, const int *caps, size_t elem_bytes);
// Bytes held by K and V buffers (capacity, all layers) plus the side data's.
size_t kv_bytes(const kv_cache *kv);
// Entries currently held, summed over layers (per KV head).
long kv_entries(const kv_cache *kv);
// The host side of appending n entries at positions pos (n,) to L: every KV head's positions,
// then len += n (the backend's kv_append writes K and V; a replayed decode step, which calls
// no backend op, notes its appends here).
void kv_note_append(kv_layer *L, const int *pos, int n);
