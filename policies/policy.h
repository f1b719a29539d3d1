// policies/policy.h — strategies. Each strategy lives in one file of policies/ and drives the
// shared forward pass (model/forward.h) through its hooks; this header is what cmd/ and jobs/ see:
// the registry (registry.c), the per-run options (options.c), and the generation loop every
// strategy shares (generate.c).
#pragma once
#include <stdio.h>

#include "../model/forward.h"
#include "../backend/sample.h"
#include "strategy.h"

// s's prefill (a composed strategy's: its parts', policies/compose.c), as strategy.prefill
// (run NULL: a zero strategy_run).
kv_cache *strategy_prefill(const strategy *s, context *cx, const int *ids, int n, int n_gen,
                           const strategy_opts *o, const strategy_run *run, float *logits,
                           prefill_info *info, char *err, size_t errlen);
// The work of s's prefill and decode steps on shape sh with options o (its parts' for a composed
// strategy; a decode strategy alone after a full prefill), by formula: model/cost.h.
void strategy_cost(const strategy *s, const cost_shape *sh, const strategy_opts *o, cost_work *w);
// s's option check (both parts' for a composed strategy): 0, or -1 with err.
int strategy_check(const strategy *s, const model *m, const strategy_opts *o, char *err,
                   size_t errlen);

// Whether s's prefill runs in chunks of cx->p.ubatch rows (--ubatch): those whose prefill
// is plain (prefill_run without hooks: every prompt row through every layer, nothing read but
// the cache), i.e. full and the decode strategies alone (topk, topk+phi: a full prefill of the
// prompt but its last token), and a composition whose prefill part does (full+Y is Y). The
// others keep one pass: their prefill hooks drop rows (speed, fastkv, swiftkv), read the
// attention of the prompt's last rows over all of it to edit the cache (snapkv, streamingllm,
// fastkv) or run a draft that scores every prompt token at once (specprefill).
int strategy_chunks(const strategy *s);
// --ubatch's default: rows of one chunk (bench/RESULTS.md, "Chunked prefill")
#define PREFILL_UBATCH 2048
#define PREFILL_UBATCH_TEXT "2048"
// The rows of activations s's prefill of n tokens holds at once with --ubatch U (U <= 0: one
// pass): min(n, U) where s chunks, else n. The memory plans count these (model/cost.h).
long strategy_prefill_rows(const strategy *s, long n, int ubatch);
// The most of strategy_prefill_rows over the n strategies of list (none: n_tok, one pass), and in
// *chunks (may be NULL) whether every one of them chunks (0 for none).
long strategies_prefill_rows(const strategy *const *list, int n, long n_tok, int ubatch, int *chunks);

// The common prefill: ids (n,) at positions 0..n-1 into a new cache of capacity caps[l] per
// layer (caps NULL: n + n_gen everywhere), through hooks (may be NULL); sets info->rows_done.
// Without hooks and with cx->p.ubatch = U > 0, the prompt runs as passes over rows
// [b, b + U) at their positions, each appending to the same cache and attending to it (the
// rows before the pass included), only the last pass computing logits: the same cache and
// logits as one pass up to the rounding of products over fewer rows (fwd_row_class) and of
// attention's summation order, in the activations of U rows. A degenerate form of a strategy
// with hooks (too short a prompt: "ran full") takes this path too. Without hooks or caps, and
// with a shared prefix in cx->prefix (gen_begin's, from strategy_run.prefix) that ids start with
// and that is shorter than n: its cache copied, only rows [prefix n, n) run, along the same chunk
// grid (info->prefix_n set); cx->prefix is cleared either way.
kv_cache *prefill_run(context *cx, const int *ids, int n, int n_gen, const int *caps,
                      const fwd_hooks *hooks, float *logits, prefill_info *info, char *err,
                      size_t errlen);

// A shared prefix: tokens prefilled once (by prefix_build, plainly: every row through every
// layer) whose cache the requests that start with them copy (strategy_run.prefix), each then
// prefilling only its own rest at its true positions, along the chunk grid its whole prefill
// would take. The prefix ends a whole number of attention blocks past a chunk boundary, so that
// every row's attention runs in a block of the same rows as in the whole prefill, and a pass of
// the rest (and the prefix's last chunk) chooses its products' path as the chunk it lies in
// would (context.rows_as): so on the CPU a request answers bit for bit as its own whole
// prefill does.
typedef struct kv_prefix {
    kv_cache *kv;   // capacity n: the prefix's K and V at positions 0 .. n-1 (compressed: the
                    // entries its strategy kept, per layer and KV head)
    int *ids, n;    // its tokens
    double ms;      // its prefill's wall time
    // NULL: a plain prefill; else the prefill strategy (compresses_prefix) that compressed it
    // alone, query-agnostically, for the requests of that strategy (or of compositions of it)
    const struct strategy *by;
    char note[200];  // by's remark on the prefix (a degenerate form), or ""
} kv_prefix;
// A prefix ends a multiple of PREFIX_ALIGN rows past a chunk boundary: the CPU's attention block
// (attn_cpu.c ATTN_QB: a block's rows share one sgemm, whose rounding may depend on how many
// rows it holds), a multiple of the device kernels' query tiles.
#define PREFIX_ALIGN 128
// The fewest rows a prefix leaves to the shortest prefill using it (more than a decode step's,
// so that the rest's rows take the prefill kernels, as in the whole prefill).
#define PREFIX_REST 16
// Where a prefix of `share` tokens shared by prefills of at least n_min rows ends, for chunks of
// ubatch rows (0: one pass): at most n_min - PREFIX_REST, cut down to a multiple of PREFIX_ALIGN
// past the chunk boundary at or below that. 0: none.
int prefix_cut(int share, int n_min, int ubatch);
// ids (n,) prefilled into a new prefix of capacity n, its last chunk's products taking the path
// of the chunk of the shortest prefill using it (n_as rows): NULL + err (out of memory).
kv_prefix *prefix_build(context *cx, const int *ids, int n, int n_as, char *err, size_t errlen);
// The same compressed by prefill strategy s (s->compresses_prefix) with options o: s's prefill
// of ids (n,) as though they were the whole prompt. NULL + err.
kv_prefix *prefix_build_with(context *cx, const strategy *s, const strategy_opts *o,
                             const strategy_run *run, const int *ids, int n, char *err, size_t errlen);
// A prefill that starts from compressed prefix pf (ids start with its tokens, n > pf->n): pf's
// cache copied with room for the rest and n_gen, the rest prefilled plainly at its true positions
// (logits: the last row's), info's prefix fields and note set. NULL + err.
kv_cache *prefix_resume(context *cx, const kv_prefix *pf, const int *ids, int n, int n_gen,
                        float *logits, prefill_info *info, char *err, size_t errlen);
void prefix_free(kv_prefix *p);

// Every strategy parameter's one home (options.c's table): its flag, where it lives in
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
// The settings echo. so as strategy s runs it on model m (run: its draft): each value s decides
// from the model (tsp_layer -1: L/2-1) replaced by the value it resolves to (m NULL: so as given).
strategy_opts strategy_opts_resolved(const strategy *s, const model *m, const strategy_run *run,
                                     const strategy_opts *so);
// The parameters strategy_name reads, as one JSON object {"kv_rate":0.1,"pool":"max",...}: a
// choice by its name, a count the strategy decides per prompt (topk from --budget) or does not
// use (draft_layers with --draft) null. The text form: "kv_rate 0.1, pool max, ..." ("unset" for
// null); it writes nothing and returns 0 when the strategy reads no parameter (full).
void strategy_settings_json(FILE *out, const strategy_opts *so, const char *strategy_name);
int strategy_settings_text(FILE *out, const strategy_opts *so, const char *strategy_name);

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
    double prompt_ms;      // prefill + first token = time to first token (a packed prefill's:
                           // from gen_open, its wait for the shared pass included)
    int prefill_shared;    // prompts prefilled in the pass that prefilled this one (1: alone)
    int prefix_n;          // of prompt_n, the tokens copied from a shared prefix's cache
                           // (prefill_info.prefix_n; the prefix's own prefill not in prompt_ms)
    int prefix_compressed; // that prefix compressed once, query-agnostically (prefill_info)
    int predicted_n;       // tokens generated (sampled), including a final end-of-generation one
    int decode_runs;       // forward passes after the first token
    double decode_ms;      // time of those passes and their sampling
    size_t kv_bytes;       // measured from the cache after prefill
    long rows_done;        // prefill rows processed summed over layers (a draft's included)
    long draft_rows;       // of which a draft's (main-model layer-row equivalents)
    double hook_ms;        // of prompt_ms, the time in the strategy's prefill hooks (scoring,
                           // selection, keeps; a draft's included): context.hook_ms
    double kv_read_per_step;   // mean bytes of KV read per decode step, all layers (0: no step)
    double selector_recall;    // topk's mean recall of the exhaustive top K (-1: not measured)
    // The backend's counts (backend.h: bk_counters), when it keeps them (has_counters): over the
    // prefill up to the first token (allocs: those made inside its passes, context.pass_allocs),
    // and summed over the decode steps after the first (dev_decode_steps of them: the first
    // sizes the step's buffers).
    int has_counters;
    bk_counters dev_prefill, dev_decode;
    int dev_decode_steps;
    char label[96];        // prefill_info.label
    char note[800];        // the strategy's remark on this prompt (degenerate form) + decode report
} run_stats;

// st's device counts as one JSON value: {"prefill":{"h2d_bytes":N,"d2h_bytes":N,"syncs":N,
// "allocs":N,"launches":N,"graph_replays":N},"decode_step":{...}} (decode_step: the mean per
// step after the first, null without such steps), or null when the backend keeps none (CPU).
void run_stats_counters_json(FILE *out, const run_stats *st);

// Called with each generated token; return non-zero to stop after it. NULL: tokens not wanted.
typedef int (*run_token_fn)(void *ctx, int id);

// Prefill with strategy s (options o, context run: may be NULL), then decode up to n_predict
// tokens (n_predict >= 1) with smp, calling on_token for each; the prefill's logits (vocab,) —
// the distribution of the first generated token — into first_logits (NULL: not wanted). 0, or
// -1 with a one-line err.
int run_generate(const strategy *s, context *cx, const strategy_opts *o, const strategy_run *run,
                 const int *ids, int n, int n_predict, sampler *smp, run_token_fn on_token,
                 void *ctx, run_stats *st, float *first_logits, char *err, size_t errlen);
// Untimed: s on n made-up tokens, 2 steps (first-touch allocations, thread start-up, the weights
// paged in), so that the first measured run does not pay for them. 0, or -1 with err.
int run_warm_up(const strategy *s, context *cx, const strategy_opts *o, const strategy_run *run, int n,
                char *err, size_t errlen);

// One sequence's generation in steps, so that many sequences share their decode passes
// (run_generate is gen_begin, gen_step until done, gen_end):
typedef struct gen_seq {
    context *cx;          // the run it is a sequence of
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
    const int *ids;       // gen_open: the prompt (borrowed) until its packed prefill ran
    double t_open;        // gen_open: when it was admitted (its TTFT counts from here)
    int fed;              // gen_open: 0 until its packed prefill ran (gen_prefill_packed)
} gen_seq;

// Prefill with s, sample the first token, call on_token. 0, or -1 with err (nothing to free).
int gen_begin(gen_seq *g, const strategy *s, context *cx, const strategy_opts *o,
              const strategy_run *run, const int *ids, int n, int n_predict, sampler *smp,
              run_token_fn on_token, void *ctx, float *first_logits, char *err, size_t errlen);
// For a copy of a sequence: draw its first token from g->logits with smp, call on_token (what
// gen_begin does after its prefill).
void gen_first(gen_seq *g, sampler *smp, run_token_fn on_token, void *ctx);
// dst = a copy of src as its prefill left it (src's first token not yet decoded: call it right
// after gen_begin): its own cache and logits, no sampler and no token drawn yet (gen_first
// next), its run_stats counting no prefill work (src's). Only for a strategy whose decode reads
// nothing but the cache (no hooks, decode state or cache side data); else -2 with err naming
// strategy_name. 0, or -1 with err (out of memory for the cache).
int gen_fork(gen_seq *dst, const gen_seq *src, const char *strategy_name, char *err, size_t errlen);
// Packed prefill (jobs/run.c with --parallel): the prompts of several sequences in one forward
// pass (fwd_run_batch), each prompt whole (never split across passes) with the logits it gets
// alone, bit for bit. Whether s's prefill may share a pass: only the plain prefill (every prompt
// row through every layer, no hooks, nothing kept but the cache: full); a strategy whose prefill
// hooks read attention, drop rows, stop early or draw tokens runs alone (gen_begin).
int gen_packs(const strategy *s);
// gen_begin up to its prefill (s: gen_packs): g keeps ids (borrowed until its prefill ran) and
// a new cache with room for n + n_predict entries; gen_prefill_packed runs the prefill. Its TTFT
// (st.prompt_ms) counts from this call: the wait for a shared pass is part of it. 0, or -1 with
// err (nothing to free).
int gen_open(gen_seq *g, const strategy *s, context *cx, const int *ids, int n, int n_predict,
             sampler *smp, run_token_fn on_token, void *ctx, char *err, size_t errlen);
// One pass prefilling g[0] and those of the opened sequences g[1..k) (in that order) that can
// share it without changing any row's products: each prompt's row count alone, the pass's total
// and the number of prompts in it (the LM head's rows) all of g[0]'s rounding class
// (fwd_row_class; -1: g[0] alone), at most max_rows rows in all (g[0] whatever its length) and
// FWD_MAX_BATCH prompts. With cx->p.ubatch = U > 0: at most U rows in all, and a g[0]
// longer than U runs alone in chunks (prefill_run's). Each one run draws its first token
// (gen_first) and gets fed = 1. Returns how many it ran.
int gen_prefill_packed(gen_seq *const *g, int k, int max_rows);
// One decode step of every unfinished sequence among g[0..k) (one context), as one forward pass.
void gen_step(gen_seq *const *g, int k);
// The decode report into st.note; frees the cache and the strategy's decode state.
void gen_end(gen_seq *g);

double now_ms(void);
