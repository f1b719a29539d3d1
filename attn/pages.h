// attn/pages.h — topk's page-bound selector (`--selector pages`; Quest's page summaries): per
// page of P consecutive cached keys of one KV head, the element-wise minimum and maximum of its
// keys. For a query q the page's bound sum_c max(q_c lo_c, q_c hi_c) is never below q.k of any
// key in it, so a decode step reads the bounds (2 rows a page), scores exactly only the keys of
// the pages with the largest bounds, and takes the top K among those. Mechanisms only;
// policies/topk_phi.c decides the page size and how many pages a step reads.
#pragma once
#include "../weights/kvrow.h"

// What attn_topk_step (backend/backend.h) reads to select by pages. bounds: (n_kv_head, n_pages)
// pages, each two rows (lo, hi) of `type` (kv_row_bytes each), over the mid region's entries
// [sink + p size, sink + (p + 1) size) (the last page may be partial); backend memory.
typedef struct topk_pages {
    const void *bounds;
    enum kv_type type;     // pages_bound_type of the cache's K type
    int size;              // P, entries per page
    int n_pages;           // ceil(mid entries / P)
    int read;              // pages scored exactly per KV head (>= n_pages: every key, as exact)
    // Backend memory for a step's work, planned with the state (no allocation inside a pass):
    // the bounds' scores (n_kv_head, n_pages), the picked pages (n_kv_head, read) and the
    // candidates' scores (heads, read x size). NULL: the backend finds its own (the CPU's).
    float *work_bounds, *work_cand;
    int *work_pages;
} topk_pages;

// The row type bounds are kept in for keys of type kt: the keys' own (f32, bf16, f16); f16 for
// q8_0 (whose decoded values f16 rounds outward: lo down, hi up, never inside the true range).
enum kv_type pages_bound_type(enum kv_type kt);
// Pages of ceil(n / P) entries, and the bytes of one KV head's bounds.
int pages_count(int n, int size);
size_t pages_bytes(enum kv_type kt, int n, int size, int hd);
// CPU: the bounds of n key rows k (type kt, kv_row_bytes apart) into out (ceil(n / P), 2) rows
// of pages_bound_type(kt).
void pages_build_cpu(void *out, const void *k, enum kv_type kt, int n, int size, int hd);
// One value of type t (f16 or bf16 or f32) rounded towards +inf (up 1) or -inf (up 0): the
// bound of x that never lies inside [lo, hi]'s true range; its bits in *dst (2 or 4 bytes).
void pages_round(enum kv_type t, float x, int up, void *dst);
