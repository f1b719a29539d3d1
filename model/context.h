// model/context.h — a run context: one run over a loaded model (llama.cpp's llama_context,
// llama2.c's RunState). The model is what was loaded (weights, config, per-model derived state)
// and is shared; a context holds what a run changes: the pass buffers planned for its largest
// pass, the recorded decode step, the row types of the KV caches it makes, the prefill's chunk
// size and the progress callback. Every sequence of a context (a gen_seq with its own cache,
// sampler and strategy state, policies/policy.h) runs through its buffers; several contexts over
// one model run independently, and each is freed on its own.
#pragma once
#include "model.h"

// What a context is made with; zero is every default (the backend's own KV element, one pass
// per prefill, no progress).
typedef struct ctx_params {
    // Chunked prefill (--ubatch, policies/generate.c prefill_run): a plain prefill runs its
    // prompt in passes of at most ubatch rows (0: one pass, whatever its length).
    int ubatch;
    // The row types of the KV caches fwd_kv_create makes (--cache-type-k/-v): with kv_typed,
    // K rows of kv_k and V rows of kv_v (weights/kvrow.h); 0: the backend's own element.
    int kv_typed;
    enum kv_type kv_k, kv_v;
} ctx_params;

typedef struct context {
    model *m;               // borrowed: outlives the context
    ctx_params p;
    // Optional: called after each layer of a multi-row pass (progress display).
    void (*on_layer)(void *ctx, int layer, int n_layer, int rows);
    void *on_layer_ctx;
    // While a chunked prefill runs: the prompt's rows before the current pass and its length
    // (for on_layer's display; both 0 outside a chunked prefill).
    long prefill_done, prefill_total;
    // While a pass runs rows of a prompt in a shorter pass than its chunk would be (a suffix after
    // a reused prefix, policies/generate.c): the chunk's rows, for the products' path
    // (backend.rows_as; 0: the pass's own rows).
    int rows_as;
    // While a strategy's prefill runs for a request that may reuse a shared prefix (gen_begin,
    // from strategy_run.prefix): that prefix (policies/policy.h: kv_prefix), which a plain
    // prefill (prefill_run without hooks or capacities) takes instead of recomputing it, and
    // then clears. NULL otherwise.
    const struct kv_prefix *prefix;
    struct fwd_run_state *run;     // the forward pass's buffers (model/pass.h; NULL until used)
    struct fwd_decoder *decoder;   // fwd_decode's recorded step (NULL until used)
    // Device allocations the backend made inside this context's passes (bk_counters.allocs
    // between a pass's start and end: what its planning did not foresee; 0 on the CPU).
    unsigned long long pass_allocs;
    // Wall time spent in strategies' hooks after a layer's attention or block (scoring,
    // selection, keeps), summed over this context's passes: on the CPU the hooks' work itself;
    // on a device the host's time in them (their kernels run asynchronously).
    double hook_ms;
} context;

// The K and V row types of the caches a context made with p makes on bk (p->kv_k/kv_v, or the
// backend's own element).
void ctx_kv_types(const ctx_params *p, const backend *bk, enum kv_type *k, enum kv_type *v);
// A context over m (p NULL: the defaults). Nothing is allocated on the backend until a pass runs.
context *ctx_new(model *m, const ctx_params *p);
// A new context over the same model with the same parameters and callback (buffers of its own).
context *ctx_fork(const context *cx);
// Frees the context's buffers and recorded step (the model's backend must still live). NULL: no-op.
void ctx_free(context *cx);
