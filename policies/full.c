// policies/full.c — `full`: the reference. Every prompt token goes through every layer and every
// layer keeps every key and value. No hooks.
#include "../util/check.h"
#include "policy.h"

#include <stdlib.h>

static kv_cache *full_prefill(model *m, const int *ids, int n, int n_gen, const strategy_opts *o,
                              float *logits, prefill_info *info, char *err, size_t errlen) {
    (void)o;
    int L = m->cfg.n_layer;
    int *caps = xmalloc((size_t)L * sizeof(int)), *pos = xmalloc((size_t)n * sizeof(int));
    for (int l = 0; l < L; l++) caps[l] = n + n_gen;
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_cache *kv = fwd_kv_create(m, caps, err, errlen);
    if (kv) info->rows_done = fwd_run(m, kv, ids, pos, n, NULL, logits, 0);
    free(caps);
    free(pos);
    return kv;
}

const strategy strategy_full = {
    .name = "full",
    .about = "every token through every layer, every KV kept (the reference)",
    .prefill = full_prefill,
};
