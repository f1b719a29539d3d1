// policies/topk_phi.h — the end-to-end comparison of topk / topk+phi decode against full
// attention that `sift fit-phi`'s verdict and bench/phi_needles.py use (one shared prefill).
#pragma once
#include "../attn/phi.h"
#include "../model/forward.h"

typedef struct topk_variant {
    const phi_maps *maps;   // NULL: `topk` (selection only); borrowed
    int k;                  // retrieved mid entries per query head
} topk_variant;

// One prefill of ids[0..n-1) at positions pos0.. (RoPE is relative: a shift changes no score,
// only the angles the maps see), then decode from it, rewinding the cache between runs:
// full attention runs `rows` steps (the prompt's last token, then its own greedy tokens,
// full_tok (rows,)); every variant runs the same tokens (forced), kl (n_v, rows) =
// KL(full || variant) per row, agree (n_v,) = share of rows whose argmax is full's. With
// n_free > 0, free_tok ((n_v + 1), n_free): full's and then each variant's own greedy tokens.
// Regions as topk+phi's (sink, tail of the n - 1 prefilled tokens). 0, or -1 with err.
int topk_compare(model *m, const int *ids, int n, int pos0, int sink, int tail, int rows,
                 const topk_variant *v, int n_v, double *kl, double *agree, int *full_tok,
                 int n_free, int *free_tok, char *err, size_t errlen);
