// model/forward.h — the shared forward pass. One layer loop serves every strategy: it runs a set
// of ROWS (hidden states) at explicit original POSITIONS through the layers, appending each
// layer's K/V to that layer's cache, and calls the policy's hooks between layers. Strategy names
// never appear here: hooks get mechanisms (fwd_keep_rows, the KV cache) and decide.
#pragma once
#include "../kv/kv.h"
#include "model.h"

typedef struct fwd_state {
    model *m;
    kv_cache *kv;
    int n;            // rows alive
    int *pos;         // (n,) original absolute positions, host
    int *row_id;      // (n,) index of each alive row in the batch as given to fwd_run
    void *x;          // (n, d) residual stream, backend memory
    long rows_done;   // rows processed summed over layers (a measure of prefill work)
} fwd_state;

typedef struct fwd_hooks {
    void *ctx;
    // After layer l's block. May shrink the row set with fwd_keep_rows or edit the cache.
    // Returns 0, or -1 to abort the pass.
    int (*after_layer)(void *ctx, fwd_state *s, int l);
} fwd_hooks;

// Runs tokens (n,) at positions pos (n,) through every layer of m, appending K/V to kv.
// logits (host): the last alive row's logits (vocab,), or every row's (n, vocab) when all_rows
// (only valid when no hook drops rows). hooks may be NULL. Returns rows processed over layers.
long fwd_run(model *m, kv_cache *kv, const int *tokens, const int *pos, int n,
             const fwd_hooks *hooks, float *logits, int all_rows);

// Keep rows idx (k,) of the alive set, in that order (idx into the current alive rows).
void fwd_keep_rows(fwd_state *s, const int *idx, int k);

// A KV cache on m's backend with capacity caps[l] per layer (NULL + err if out of memory).
kv_cache *fwd_kv_create(model *m, const int *caps, char *err, size_t errlen);
