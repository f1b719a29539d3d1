// policies/full.c — `full`: the reference. Every prompt token goes through every layer and every
// layer keeps every key and value. No hooks.
#include "policy.h"

static kv_cache *full_prefill(context *cx, const int *ids, int n, int n_gen, const strategy_opts *o,
                              const strategy_run *run, float *logits, prefill_info *info,
                              char *err, size_t errlen) {
    (void)o, (void)run;
    return prefill_run(cx, ids, n, n_gen, NULL, NULL, logits, info, err, errlen);
}

const strategy strategy_full = {
    .name = "full",
    .about = "every token through every layer, every KV kept (the reference)",
    .prefill = full_prefill,
};
