// policies/topk_phi.h — what of `topk+phi` (policies/topk_phi.c) others use: its decode hooks
// over a given prefill (fit-phi's held-out check, fit/phi_check.c), its budget arithmetic and
// its training-free maps.
#pragma once
#include "../attn/phi.h"
#include "../model/forward.h"

// The decode hooks of topk (maps NULL) or topk+phi (maps borrowed) over kv, whose entries are
// all prompt entries: regions sink and tail, k mid entries retrieved per query head. Their state
// is kv's side data (kv->side_free frees it; then the cache, rewound, takes other hooks).
fwd_hooks topk_phi_hooks(model *m, kv_cache *kv, int sink, int tail, int k, const phi_maps *maps);

// R_phi = ceil(d_phi/2 + d_phi/d_h) of maps: the token-equivalents reading the phi cache costs
// (spec: budgets); topk+phi retrieves that many fewer entries than topk at the same --budget.
int topk_phi_cache_tokens(const phi_maps *maps);
// The training-free maps topk+phi uses without --phi: positive random features of m's shapes
// (fixed seed), d_phi features per head.
phi_maps *topk_phi_fallback_maps(const model *m, int d_phi);
