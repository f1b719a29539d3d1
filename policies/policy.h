// policies/policy.h — strategies. Each strategy lives in one file of policies/ and drives the
// shared forward pass (model/forward.h) through its hooks; this header is what main.c sees:
// the registry, the per-run options, and the generation loop every strategy shares.
#pragma once
#include "../model/forward.h"
#include "../model/sample.h"

typedef struct strategy_opts {
    int n_threads;   // reserved for strategies that run helper passes
} strategy_opts;

typedef struct strategy {
    const char *name;
    const char *about;   // one line for --help
    // Prefill ids (n,) into a new KV cache with room for n_gen more tokens; write the last
    // prompt row's logits (vocab,) and the rows processed summed over layers.
    // NULL + one-line err on failure (bad parameters for this prompt, out of memory).
    kv_cache *(*prefill)(model *m, const int *ids, int n, int n_gen, const strategy_opts *o,
                         float *logits, long *rows_done, char *err, size_t errlen);
} strategy;

const strategy *strategy_find(const char *name);   // NULL if unknown
// Names of all strategies, comma separated, for help and errors.
const char *strategy_names(void);

typedef struct run_stats {
    int prompt_n;          // prompt tokens
    double prompt_ms;      // prefill + first token = time to first token
    int predicted_n;       // tokens generated (sampled), including a final end-of-generation one
    int decode_runs;       // forward passes after the first token
    double decode_ms;      // time of those passes and their sampling
    size_t kv_bytes;       // measured from the cache after prefill
    long rows_done;        // prefill rows processed summed over layers
} run_stats;

// Called with each generated token; return non-zero to stop after it.
typedef int (*run_token_fn)(void *ctx, int id);

// Prefill with strategy s, then decode up to n_predict tokens (n_predict >= 1) with smp,
// calling on_token for each. 0, or -1 with a one-line err.
int run_generate(const strategy *s, model *m, const strategy_opts *o, const int *ids, int n,
                 int n_predict, sampler *smp, run_token_fn on_token, void *ctx, run_stats *st,
                 char *err, size_t errlen);

double now_ms(void);
