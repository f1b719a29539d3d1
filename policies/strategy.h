// policies/strategy.h — what a strategy is: its options, the context it runs in, what its
// prefill reports, and the struct of functions each strategy file fills. Types only (no code behind them), so that the
// registry and generation loop (policy.h), the strategies and their composition (compose.c) all
// stand on it without standing on each other.
#pragma once
#include "../model/cost.h"
#include "../model/forward.h"
#include "../backend/sample.h"

// Every strategy's parameters (flags of the one table, cmd/flags.c). A value of 0 / -1 where noted means "the
// strategy's default for this model", resolved by the strategy from the model's depth.
typedef struct strategy_opts {
    // speed
    int speed_depth;        // K layers that see the prompt; 0 = ceil(0.875 L)
    int anchor;             // 1: the first prompt token is an anchor kept in every layer; 0: none
    // fastkv, snapkv, streamingllm
    int tsp_layer;          // -1 = L/2 - 1
    float tsp_rate;         // 0.2
    float kv_rate;          // 0.1
    int window;             // 8
    int pool_kernel;        // 7
    int pool;               // window-score smoothing: 0 = max-pool, 1 = average pool
    int kv_len;             // fastkv, snapkv: KV entries kept per layer and KV head; 0 = kv_rate
    int tsp_len;            // fastkv: rows propagated past the TSP layer; 0 = tsp_rate
    // specprefill
    float keep;             // 0.3
    int lookahead;          // 8
    int chunk;              // 32
    int spec_pool;          // 13
    const char *draft_path; // --draft MODEL (loaded into strategy_run.draft by cmd/cli.c), or NULL
    int draft_layers;       // --draft-layers N: the main model's first N layers; 0 = unset
    int keep_last;          // 1: the last chunk is always kept; 0: the top chunks alone
    // swiftkv
    int swiftkv_layers;     // l: layers the whole prompt runs; 0 = L/2 (or the checkpoint's)
    int swiftkv_group;      // G: layers sharing one KV cache; 0 = 1 (or the checkpoint's)
    int swiftkv_fold;       // training-free init: 1 = fold each layer's norm gamma into its
                            // K/V, 0 = the layer-l norm as the paper's code; -1 = default (0)
    // topk+phi, topk
    int sink, tail;         // anchors: first 4 and last 16 prompt tokens
    int topk;               // retrieved entries per query head; -1 = from budget
    float budget;           // 0.02 of the prompt (exact reads incl. anchors and the phi cache)
    const char *phi_path;   // --phi FILE (fitted maps) or NULL: positive random features
    int selector;           // the decode selector: 0 exact (every mid key scored), 1 pages
    int page_size;          // P: keys per page of bounds (--selector pages)
    int pages;              // pages scored exactly per KV head; -1 = from K (max(2048, 8 K) keys)
    int selector_recall;    // 1: each step also runs the exact selector and counts the recall
} strategy_opts;

// The context a strategy runs in: not a parameter of any strategy, but what the command line
// loaded (cmd/cli.c: cli_load) and what the request asks. Zero (or a NULL pointer): no draft, no
// end-of-generation test, greedy, nothing counted.
typedef struct strategy_run {
    context *draft;         // --draft: a run context over a separate model with the same
                            // vocabulary, or NULL
    // end-of-generation test for tokens a strategy draws itself (specprefill lookahead)
    int (*is_eog)(const void *ctx, int id);
    const void *eog_ctx;
    // --kept-map: a decode strategy that selects keys counts how often it read each prompt key
    // (prefill_info.decode_selected)
    int count_selected;
    // the request's sampling settings, for tokens a strategy draws itself (specprefill
    // lookahead); gen_begin copies them from the request's sampler. Zero: greedy.
    sample_params sampling;
    // a prefix of the request's tokens prefilled once for the requests that share it (the job
    // runner's prefix cache, jobs/prefix.c; policy.h: kv_prefix), which a plain prefill copies
    // instead of recomputing (gen_begin hands it to the context); NULL: none
    const struct kv_prefix *prefix;
} strategy_run;

// What a prefill reports besides the cache and logits.
typedef struct prefill_info {
    long rows_done;         // prompt rows processed summed over layers (full: n * L)
    char note[400];         // set when the prompt ran a degenerate form ("too short: ran full")
    char label[96];         // the variant that ran, where the name alone does not say it
                            // ("self-draft: first 15 of 30 layers"); shown beside the name
    long draft_rows;        // a draft's work in main-model layer rows (counted in rows_done too)
    int prefix_n;           // prompt tokens taken from a shared prefix's cache (strategy_run.prefix:
                            // not computed, not in rows_done); 0: none
    int prefix_compressed;  // 1: that prefix was compressed once by the strategy's prefill part,
                            // query-agnostically (kv_prefix.by)
    // Optional: hooks every decode step must run with (zero: none; a strategy keeps their ctx
    // where it outlives them: the cache's side data, the model), how to free their ctx after the
    // last step (NULL; a composition's pair of hooks: set), and a report of decode work appended
    // to the run's note at the end (may be NULL). Whoever decodes after prefill uses them
    // (run_generate does).
    fwd_hooks decode;
    void (*decode_free)(void *ctx);
    void (*decode_report)(void *ctx, char *buf, size_t len);
    // Optional: mean bytes of KV the decode steps so far read exactly per step, all layers
    // (NULL: every cached entry is read, which gen_step counts itself).
    double (*decode_read_bytes)(void *ctx);
    // Optional: the mean recall of the exhaustive top K by the steps' selector so far (in [0,
    // 1]), or -1 when not measured (--selector-recall off).
    double (*decode_recall)(void *ctx);
    // Optional (strategy_run.count_selected): for cache layer `layer` (kl: that layer of the
    // cache), adds to sel[pos] how often decode read prompt position pos's key exactly, over the
    // steps so far and the KV heads (pos < n_prompt); returns what each count is out of (steps x
    // KV heads; 0: nothing counted). NULL: decode reads every cached entry.
    long (*decode_selected)(void *ctx, int layer, const struct kv_layer *kl, long *sel, int n_prompt);
} prefill_info;

typedef struct strategy {
    const char *name;
    const char *about;   // one line for --help
    // Prefill ids (n,) with options o in context run (never NULL) into a new KV cache with room
    // for n_gen more tokens; write the last prompt row's logits (vocab,). NULL + one-line err on
    // failure (bad parameters for this prompt or model, out of memory).
    kv_cache *(*prefill)(context *cx, const int *ids, int n, int n_gen, const strategy_opts *o,
                         const strategy_run *run, float *logits, prefill_info *info, char *err,
                         size_t errlen);
    // Optional: reject options that cannot work with this model (layer out of range, draft
    // with another vocabulary size, ...) before any prompt runs. 0 or -1 with err.
    int (*check)(const model *m, const strategy_opts *o, char *err, size_t errlen);
    // 1: runs models some of whose layers lack q/k/v projections (it supplies their K/V and
    // queries from other weights); every other strategy refuses them.
    int supplies_qkv;
    // What the strategy changes, for composition (policies/compose.c): PHASE_NONE (full),
    // PHASE_PREFILL (the prompt's processing and the cache it leaves) or PHASE_DECODE (only the
    // decode steps' attention; its prefill is full attention).
    enum { PHASE_NONE, PHASE_PREFILL, PHASE_DECODE } phase;
    // PHASE_DECODE: install the decode hooks (info->decode, decode_free, decode_report,
    // decode_read_bytes) over kv, which holds whatever some prefill of the prompt (n tokens)
    // kept, per layer and KV head; every entry there now is a prompt entry. Appends its remark
    // to info->note. The caller then runs the decode steps (the prompt's last token first when
    // it is not in kv yet). 0, or -1 with err (kv untouched).
    int (*attach)(context *cx, kv_cache *kv, int n, const strategy_opts *o, const strategy_run *run,
                  prefill_info *info, char *err, size_t errlen);
    // PHASE_PREFILL: 1 when its prefill only keeps entries per layer and KV head of a cache
    // whose every layer is there (snapkv, streamingllm, fastkv), so that a shared prefix it
    // compressed alone (query-agnostically: scored by the prefix's own last window) takes any
    // rest prefilled plainly after it (jobs/prefix.c: compress once, ask many).
    int compresses_prefix;
    // A composed strategy PREFILL+DECODE (strategy_find makes them): its two parts; NULL else.
    const struct strategy *prefill_part, *decode_part;
    // Optional: replaces in o each value this strategy decides from the model (a 0 / -1 that
    // means "the default for this model", above) by what it runs with on m (run: its draft),
    // for the settings echo. A value decided per prompt stays as it is.
    void (*resolve)(const model *m, const strategy_run *run, strategy_opts *o);
    // Optional, for `sift bench --dry-run` (model/cost.h): what the strategy's prefill of sh->n
    // tokens does (w's prefill terms and kv_entries; NULL: cost_full_prefill), and what one of
    // its decode steps reads over the w->kv_entries some prefill left (weight_bytes, kv_bytes, and
    // any prefill work its attach adds; NULL: cost_dense_decode). From the shape alone: what a
    // strategy decides per prompt (specprefill's chunks) is taken at its expected count.
    void (*cost_prefill)(const cost_shape *sh, const strategy_opts *o, cost_work *w);
    void (*cost_decode)(const cost_shape *sh, const strategy_opts *o, cost_work *w);
} strategy;

