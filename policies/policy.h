// policies/policy.h — strategies. Each strategy lives in one file of policies/ and drives the
// shared forward pass (model/forward.h) through its hooks; this header is what main.c sees:
// the registry, the per-run options, and the generation loop every strategy shares.
#pragma once
#include "../model/forward.h"
#include "../model/sample.h"

// Every strategy's parameters (flags of main.c). A value of 0 / -1 where noted means "the
// strategy's default for this model", resolved by the strategy from the model's depth.
typedef struct strategy_opts {
    int n_threads;
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
    const char *draft_path; // --draft MODEL (loaded into `draft` by the command line), or NULL
    model *draft;           // --draft: a separate model with the same vocabulary, or NULL
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
    // end-of-generation test for strategies that decode internally (specprefill lookahead)
    int (*is_eog)(const void *ctx, int id);
    const void *eog_ctx;
    // not a flag: the request's sampling settings, for tokens a strategy draws itself
    // (specprefill lookahead); gen_begin copies them from the request's sampler. Zero: greedy.
    sample_params sampling;
} strategy_opts;

// What a prefill reports besides the cache and logits.
typedef struct prefill_info {
    long rows_done;         // prompt rows processed summed over layers (full: n * L)
    char note[400];         // set when the prompt ran a degenerate form ("too short: ran full")
    char label[96];         // the variant that ran, where the name alone does not say it
                            // ("self-draft: first 15 of 30 layers"); shown beside the name
    long draft_rows;        // a draft's work in main-model layer rows (counted in rows_done too)
    // Optional: hooks every decode step must run with (zero: none; their ctx may live in the
    // cache's side data), how to free their ctx after the last step (may be NULL), and a report
    // of decode work appended to the run's note at the end (may be NULL). Whoever decodes after
    // prefill uses them (run_generate does).
    fwd_hooks decode;
    void (*decode_free)(void *ctx);
    void (*decode_report)(void *ctx, char *buf, size_t len);
    // Optional: mean bytes of KV the decode steps so far read exactly per step, all layers
    // (NULL: every cached entry is read, which gen_step counts itself).
    double (*decode_read_bytes)(void *ctx);
} prefill_info;

typedef struct strategy {
    const char *name;
    const char *about;   // one line for --help
    // Prefill ids (n,) into a new KV cache with room for n_gen more tokens; write the last
    // prompt row's logits (vocab,). NULL + one-line err on failure (bad parameters for this
    // prompt or model, out of memory).
    kv_cache *(*prefill)(model *m, const int *ids, int n, int n_gen, const strategy_opts *o,
                         float *logits, prefill_info *info, char *err, size_t errlen);
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
    int (*attach)(model *m, kv_cache *kv, int n, const strategy_opts *o, prefill_info *info,
                  char *err, size_t errlen);
    // A composed strategy PREFILL+DECODE (strategy_find makes them): its two parts; NULL else.
    const struct strategy *prefill_part, *decode_part;
} strategy;

// s's prefill (a composed strategy's: its parts', policies/compose.c), as strategy.prefill.
kv_cache *strategy_prefill(const strategy *s, model *m, const int *ids, int n, int n_gen,
                           const strategy_opts *o, float *logits, prefill_info *info, char *err,
                           size_t errlen);
// s's option check (both parts' for a composed strategy): 0, or -1 with err.
int strategy_check(const strategy *s, const model *m, const strategy_opts *o, char *err,
                   size_t errlen);

// The common prefill: ids (n,) at positions 0..n-1 into a new cache of capacity caps[l] per
// layer (caps NULL: n + n_gen everywhere), through hooks (may be NULL); sets info->rows_done.
kv_cache *prefill_run(model *m, const int *ids, int n, int n_gen, const int *caps,
                      const fwd_hooks *hooks, float *logits, prefill_info *info, char *err,
                      size_t errlen);

// Every strategy parameter's one home (policy.c's table): its flag, where it lives in
// strategy_opts, its type, range and default, the strategies that read it, and its help line.
// The command-line parser, --help, the range errors, strategy_opts_default and the settings
// echoed in JSON records are all made from the table; adding a parameter is a field above
// and a row there.
enum opt_type {
    OPT_INT,      // int in [lo, hi]
    OPT_ODD,      // odd int in [lo, hi] (a window centred on each token)
    OPT_FLOAT,    // float in [lo, hi]
    OPT_CHOICE,   // int set by name: choices "name=value|name=value"
    OPT_PATH,     // const char * (a file)
};

typedef struct opt_def {
    const char *flag;      // "--kv-rate"
    const char *metavar;   // "R" (shown in --help)
    enum opt_type type;
    size_t offset;         // of the field in strategy_opts
    double lo, hi;         // OPT_INT, OPT_ODD, OPT_FLOAT
    const char *choices;   // OPT_CHOICE
    double def;            // the default (OPT_PATH: none)
    const char *def_text;  // the default as --help says it when it depends on the model, or NULL
    const char *used_by;   // "fastkv, snapkv" (the strategies that read it)
    const char *help;
} opt_def;

// The table, n entries; one by flag name (NULL if none).
const opt_def *strategy_opts_table(int *n);
const opt_def *strategy_opt_find(const char *flag);
// Sets o's field of d from text v: 0, or -1 with a one-line err naming the flag and the range.
int strategy_opt_set(strategy_opts *o, const opt_def *d, const char *v, char *err, size_t errlen);
// Whether strategy `name` reads d.
int strategy_opt_used_by(const opt_def *d, const char *name);
// d's value in o as JSON (a number, a string or null) into buf.
void strategy_opt_json(const strategy_opts *o, const opt_def *d, char *buf, size_t len);

// The table's defaults (0 / -1 where a strategy resolves the value from the model).
strategy_opts strategy_opts_default(void);

// By name: a registered strategy, or a composition PREFILL+DECODE of a prefill strategy (or
// full) and a decode strategy ("fastkv+topk", "specprefill+topk+phi"). NULL if neither.
const strategy *strategy_find(const char *name);
// Why name is not a strategy, when it reads like a composition that is refused ("two prefill
// strategies do not compose ..."); NULL otherwise.
const char *strategy_refusal(const char *name);
int strategy_count(void);
const strategy *strategy_at(int i);                // registry order, i < strategy_count()
// Names of all strategies, comma separated, for help and errors.
const char *strategy_names(void);

typedef struct run_stats {
    int prompt_n;          // prompt tokens
    double prompt_ms;      // prefill + first token = time to first token
    int predicted_n;       // tokens generated (sampled), including a final end-of-generation one
    int decode_runs;       // forward passes after the first token
    double decode_ms;      // time of those passes and their sampling
    size_t kv_bytes;       // measured from the cache after prefill
    long rows_done;        // prefill rows processed summed over layers (a draft's included)
    long draft_rows;       // of which a draft's (main-model layer-row equivalents)
    double kv_read_per_step;   // mean bytes of KV read per decode step, all layers (0: no step)
    char label[96];        // prefill_info.label
    char note[800];        // the strategy's remark on this prompt (degenerate form) + decode report
} run_stats;

// Called with each generated token; return non-zero to stop after it.
typedef int (*run_token_fn)(void *ctx, int id);

// Prefill with strategy s, then decode up to n_predict tokens (n_predict >= 1) with smp,
// calling on_token for each. 0, or -1 with a one-line err.
int run_generate(const strategy *s, model *m, const strategy_opts *o, const int *ids, int n,
                 int n_predict, sampler *smp, run_token_fn on_token, void *ctx, run_stats *st,
                 char *err, size_t errlen);
// run_generate that also copies the prefill's logits (vocab,) — the distribution of the first
// generated token — into first_logits (NULL: not wanted).
int run_generate_first(const strategy *s, model *m, const strategy_opts *o, const int *ids, int n,
                       int n_predict, sampler *smp, run_token_fn on_token, void *ctx,
                       run_stats *st, float *first_logits, char *err, size_t errlen);

// One sequence's generation in steps, so that many sequences share their decode passes
// (run_generate is gen_begin, gen_step until done, gen_end):
typedef struct gen_seq {
    model *m;
    sampler *smp;
    run_token_fn on_token;
    void *ctx;
    kv_cache *kv;
    prefill_info info;
    float *logits;        // (vocab,) the last pass's
    int n_prompt, n_predict;
    int tok;              // the last sampled token (the next step's input)
    int done;             // on_token asked to stop, or n_predict tokens are out
    run_stats st;         // decode_ms: the sum of the (shared) steps it took part in
    double read_sum;      // bytes of KV the plain decode steps read
} gen_seq;

// Prefill with s, sample the first token, call on_token. 0, or -1 with err (nothing to free).
int gen_begin(gen_seq *g, const strategy *s, model *m, const strategy_opts *o, const int *ids,
              int n, int n_predict, sampler *smp, run_token_fn on_token, void *ctx,
              float *first_logits, char *err, size_t errlen);
// One decode step of every unfinished sequence among g[0..k) (one model), as one forward pass.
void gen_step(gen_seq *const *g, int k);
// The decode report into st.note; frees the cache and the strategy's decode state.
void gen_end(gen_seq *g);

double now_ms(void);
