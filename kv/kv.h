// kv/kv.h — the KV cache. Each layer has its own capacity and length; K and V are dense
// (n_kv_head, cap, head_dim) in backend memory, keys stored post-RoPE; every entry remembers its
// original absolute position per KV head (pos, host memory), so a layer may keep different
// tokens per head and attention masks by position, not by index. Bytes are counted exactly.
// K and V each have a row type (weights/kvrow.h: f32, bf16, f16, q8_0; they may differ): a row
// (one entry of one KV head) takes k_row / v_row bytes. A cache made by kv_create holds the
// backend's own element (4 bytes: f32, 2: bf16).
#pragma once
#include <stddef.h>

#include "../weights/kvrow.h"

typedef struct kv_layer {
    int cap, len;              // entries per KV head
    int n_kv_head, head_dim;
    void *k, *v;               // (n_kv_head, cap) rows of k_row / v_row bytes
    enum kv_type k_type, v_type;
    size_t k_row, v_row;       // bytes of one row: kv_row_bytes(type, head_dim)
    int *pos;                  // (n_kv_head, cap) original positions
    int pos_stale;             // 1: pos is behind the backend's copy (a keep on the device left
                               // it there): read it through fwd_kv_pos (model/forward.h)
} kv_layer;

typedef void *(*kv_alloc_fn)(void *ctx, size_t n_elems);
typedef void (*kv_free_fn)(void *ctx, void *p);

typedef struct kv_cache {
    int n_layer;
    kv_layer *layers;
    size_t elem_bytes;         // the backend's element (what alloc counts in)
    enum kv_type k_type, v_type;
    kv_alloc_fn alloc;
    kv_free_fn free;
    void *mem_ctx;
    // Optional side data a strategy attaches (decode summaries): freed by kv_free with
    // side_free, its side_bytes counted by kv_bytes.
    void *side;
    void (*side_free)(void *side);
    size_t side_bytes;
} kv_cache;

// caps[l] = capacity of layer l in entries; rows of the backend's element (elem_bytes 4: f32,
// 2: bf16). NULL (and a message) when memory runs out.
kv_cache *kv_create(int n_layer, int n_kv_head, int head_dim, const int *caps, size_t elem_bytes,
                    kv_alloc_fn alloc, kv_free_fn free, void *mem_ctx, char *err, size_t errlen);
// The same with K rows of k_type and V rows of v_type (alloc still counts elem_bytes units: each
// buffer is rounded up to whole units). NULL + message when head_dim does not fit a type.
kv_cache *kv_create_typed(int n_layer, int n_kv_head, int head_dim, const int *caps,
                          size_t elem_bytes, enum kv_type k_type, enum kv_type v_type,
                          kv_alloc_fn alloc, kv_free_fn free, void *mem_ctx, char *err,
                          size_t errlen);
void kv_free(kv_cache *kv);
// The row type of a backend's own element (4: f32, 2: bf16).
enum kv_type kv_native_type(size_t elem_bytes);
// Bytes kv_create_typed would take for these capacities: K and V rows plus positions.
size_t kv_bytes_for(int n_layer, int n_kv_head, int head_dim, const int *caps, enum kv_type k_type,
                    enum kv_type v_type);
// Bytes held by K and V buffers (capacity, all layers) plus the side data's.
size_t kv_bytes(const kv_cache *kv);
// Entries currently held, summed over layers (per KV head).
long kv_entries(const kv_cache *kv);
// The host side of appending n entries at positions pos (n,) to L: every KV head's positions,
// then len += n (the backend's kv_append writes K and V; a replayed decode step, which calls
// no backend op, notes its appends here).
void kv_note_append(kv_layer *L, const int *pos, int n);
