// policies/topk_phi.h — the end-to-end comparison of topk / topk+phi decode against full
// attention that `sift fit-phi`'s verdict and bench/phi_needles.py use (one shared prefill).
#pragma once
#include "../attn/phi.h"
#include "../model/forward.h"

// One prefill of ids[0..n-1) at positions pos0.. (RoPE is relative: a shift changes no score,
// only the angles the maps see); then full attention decodes `rows` steps (the prompt's last
// token, then its own greedy tokens) and, with n_free > 0, n_free free greedy steps. Regions as
// topk+phi's (sink, tail of the n - 1 prefilled tokens). NULL + err when it cannot run.
typedef struct topk_cmp topk_cmp;
topk_cmp *topk_cmp_begin(model *m, const int *ids, int n, int pos0, int sink, int tail, int rows,
                         int n_free, char *err, size_t errlen);
// Full's greedy tokens: the forced ones (rows,), or (free_run) its free ones (n_free,).
const int *topk_cmp_full(const topk_cmp *c, int free_run);
// Decodes from the shared prefill with top-k retrieval (k mid entries per query head) and,
// with maps (borrowed; NULL: `topk`), their completion: full's tokens forced, kl (rows,) =
// KL(full || this) per row, *agree = share of rows whose argmax is full's; free_tok (n_free,)
// (may be NULL) = its own greedy tokens. The cache is rewound after each run, so maps may be
// changed between runs.
void topk_cmp_run(topk_cmp *c, const phi_maps *maps, int k, double *kl, double *agree, int *free_tok);
void topk_cmp_end(topk_cmp *c);

// R_phi = ceil(d_phi/2 + d_phi/d_h): the token-equivalents reading the phi cache costs (spec:
// budgets); topk+phi retrieves that many fewer entries than topk at the same --budget.
int topk_phi_cache_tokens(int d_phi, int head_dim);
// The training-free maps topk+phi uses without --phi: positive random features of m's shapes
// (fixed seed), d_phi features per head.
phi_maps *topk_phi_fallback_maps(const model *m, int d_phi);
