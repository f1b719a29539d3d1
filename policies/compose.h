// policies/compose.h — composed strategies PREFILL+DECODE (policies/compose.c); the registry
// (registry.c) makes them by name and routes strategy_prefill / strategy_check here. The parts are
// registered strategies, never compositions themselves.
#pragma once
#include "strategy.h"

kv_cache *compose_prefill(const strategy *pre, const strategy *dec, context *cx, const int *ids,
                          int n, int n_gen, const strategy_opts *o, const strategy_run *run,
                          float *logits, prefill_info *info, char *err, size_t errlen);
int compose_check(const strategy *pre, const strategy *dec, const model *m, const strategy_opts *o,
                  char *err, size_t errlen);
