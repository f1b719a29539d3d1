// cmd/bench.c — `sift bench`: prefill and decode speed per strategy and context length, with
// the backend's measured ceilings turned into prefill MFU and decode MBU.
//
// For each context length P, each repetition prefills P seeded random tokens and decodes N tokens
// at that depth (greedy, end-of-text ignored) with every chosen strategy in turn, so the ratios
// against `full` come from the same run. Per (strategy, P): TTFT, prefill tok/s, TPOT, decode
// tok/s, measured KV size, prompt rows processed as % of full, and
//   TFLOP/s (full-eq) = cost_prefill_flops(P) / TTFT: the FLOPs `full` does on this prompt
//                       (model/cost.h) over this strategy's TTFT. For `full` it is the achieved
//                       rate; a strategy that skips work gets credit for the work it skipped, so
//                       its value can exceed the hardware's (the rows % column shows the work).
//   MFU % (full-eq)   = that rate / the GEMM ceiling measured in this run.
//   GB/s              = decode bytes per token / TPOT, where decode bytes = every weight once
//                       (cost_decode_weight_bytes) + the KV the step reads at mid-decode depth
//                       (the measured cache bytes less the n_gen/2 slots not yet filled).
//   MBU %             = GB/s / the read ceiling of this run (CPU: a read-only pass; CUDA: a copy).
//   KV read MiB       = the KV of those decode bytes: a decode strategy's own count of what its
//                       steps read (kv_read_per_step: topk's selector and exact set), else the
//                       mid-decode cache as above.
//   roofline ms       = decode bytes / the read ceiling: the TPOT of a step at that ceiling.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/cost.h"
#include "../util/check.h"
#include "cmd.h"
#include "flags.h"

#define MAX_CTX 16
#define GIB 1073741824.0

typedef struct {
    const char *model, *format, *draft_path, *device, *out;   // out: -o FILE (else stdout)
    const char *rates_arg;     // --rates (dry run): "h200" or four numbers, NULL: by --device
    cost_rates rates;          // what it says (NaN: none, the predictions are null)
    enum bk_weights weights;   // --weights native|fast|exact|f32 (CPU)
    const char *cache_k, *cache_v;   // --cache-type-k/-v (kvrow.h names; "auto": cli_kv_default)
    int ubatch;                      // --ubatch: rows of one prefill pass (0: one pass)
    uint32_t wtype;            // --wtype: a synthetic model's weight type (GGML_F32 default)
    int ctx[MAX_CTX], n_ctx, n_gen, reps, threads, dry_run, elem_bytes;   // ctx: -p (--n-prompt)
    int elem_given;            // --elem-bytes was given (even as its default 4)
    int ctx_size;              // -c: the longest prompt + decode (0: the model's context)
    int par[MAX_CTX], n_par;   // --parallel: sequences decoded together (1 = run_generate alone)
    int thr[MAX_CTX], n_thr;   // -t 1,2,...: CPU thread counts, each a pass of the whole table
    const strategy *strategies[MAX_STRATEGIES];
    int n_strategies;
    int prefix;                          // --prefix N: the reuse rows' shared tokens (0: none)
    int prefix_row[MAX_STRATEGIES];      // row k is strategies[k] starting from a shared prefix
    strategy_opts so;
    strategy_run run;          // the draft and end-of-generation test (cli_load)
} bench_opts;

// One strategy at one context length over the repetitions.
typedef struct {
    double *ttft, *pp, *tpot, *tg;   // [reps]; with --parallel B: per sequence (mean TTFT)
    double *agg;                     // [reps] aggregate decode tok/s of the B sequences
    double *hook;                    // [reps] ms of TTFT in the strategy's hooks (run_stats.hook_ms)
    size_t kv_bytes;
    double kv_read;       // run_stats.kv_read_per_step of the last repetition
    long rows_done;
    int prefix_n;         // prompt tokens taken from a shared prefix (bench --prefix rows)
    char dev_json[640];   // the last repetition's device counts (run_stats_counters_json)
} cell_stats;

// ---- output: rows of named fields, as a markdown table, one JSON array, JSON lines or CSV ----

typedef struct {
    const char *name;       // JSON / CSV name (stable)
    const char *md;         // markdown column header; NULL = not in the markdown table
    const char *str;        // a string value, or NULL for a number
    double v, sd;           // number (NaN = unknown: null / empty / "-"); sd when sd_name
    const char *fmt;        // printf format of v (and sd)
    const char *sd_name;    // JSON / CSV name of the spread; markdown shows "v ± sd"
} bench_field;
// fmt of a field whose str is a JSON value, written as it is (CSV: quoted)
#define FIELD_JSON "json"

static int is_json(const bench_field *f) { return f->str && f->fmt && strcmp(f->fmt, FIELD_JSON) == 0; }

enum { OUT_MD, OUT_JSON, OUT_JSONL, OUT_CSV };

typedef struct {
    int fmt, n_rows;
} bench_out;

static void put_num(const char *fmt, double v, const char *null) {
    if (isfinite(v)) printf(fmt, v);
    else fputs(null, stdout);
}

static void put_header(const bench_out *o, const bench_field *f, int n) {
    if (o->fmt == OUT_MD) {
        for (int i = 0; i < n; i++)
            if (f[i].md) printf("| %s ", f[i].md);
        printf("|\n");
        for (int i = 0; i < n; i++)
            if (f[i].md) printf("|%s", f[i].str ? "---" : "---:");
        printf("|\n");
    } else if (o->fmt == OUT_CSV) {
        for (int i = 0; i < n; i++) {
            printf("%s%s", i ? "," : "", f[i].name);
            if (f[i].sd_name) printf(",%s", f[i].sd_name);
        }
        printf("\n");
    } else if (o->fmt == OUT_JSON)
        printf("[");
}

static void put_md_row(const bench_field *f, int n) {
    for (int i = 0; i < n; i++) {
        if (!f[i].md) continue;
        printf("| ");
        if (f[i].str) printf("%s", f[i].str);
        else put_num(f[i].fmt, f[i].v, "-");
        if (f[i].sd_name && isfinite(f[i].v)) {
            printf(" ± ");
            put_num(f[i].fmt, f[i].sd, "-");
        }
        printf(" ");
    }
    printf("|\n");
}

static void put_csv_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"') putchar('"');
        putchar(*s);
    }
    putchar('"');
}

static void put_row(bench_out *o, const bench_field *f, int n) {
    if (o->n_rows == 0) put_header(o, f, n);
    if (o->fmt == OUT_MD) put_md_row(f, n);
    else if (o->fmt == OUT_CSV)
        for (int i = 0; i < n; i++) {
            if (i) putchar(',');
            if (f[i].str) put_csv_str(f[i].str);
            else put_num(f[i].fmt, f[i].v, "");
            if (f[i].sd_name) {
                putchar(',');
                put_num(f[i].fmt, f[i].sd, "");
            }
        }
    else {
        printf("%s{", o->fmt == OUT_JSON && o->n_rows ? ",\n " : "");
        for (int i = 0; i < n; i++) {
            printf("%s\"%s\":", i ? "," : "", f[i].name);
            if (is_json(&f[i])) fputs(f[i].str, stdout);
            else if (f[i].str) tok_json_str(stdout, f[i].str, strlen(f[i].str));
            else put_num(f[i].fmt, f[i].v, "null");
            if (f[i].sd_name) {
                printf(",\"%s\":", f[i].sd_name);
                put_num(f[i].fmt, f[i].sd, "null");
            }
        }
        printf("}");
    }
    if (o->fmt != OUT_JSON && o->fmt != OUT_MD) printf("\n");
    o->n_rows++;
    fflush(stdout);
}

// Closes the JSON array (an empty one when no row came).
static void put_end(const bench_out *o) {
    if (o->fmt == OUT_JSON) printf(o->n_rows ? "]\n" : "[]\n");
    fflush(stdout);
}

// ---- flags ----

// The rates a prediction is made at (model/cost.h): --rates, else the H200's with --device cuda,
// else none (NaN: the predictions are null). The H200's, from bench/RESULTS.md "First GPU runs"
// (the derivation is in bench/CUDA.md, "Predicted ratios"): GEMMs at full's 8K TTFT less its
// attention, prefill attention at fa2w's 32K rate, weights at full's 8K TPOT less its KV, KV at
// the group decode kernel's 32K rate. A value of another form is a usage error.
static const cost_rates RATES_H200 = {610e12, 272.7e12, 2845e9, 1380e9};

static cost_rates dry_rates(const char *arg, int cuda) {
    const char *s = arg ? arg : cuda ? "h200" : NULL;
    if (!s) return (cost_rates){NAN, NAN, NAN, NAN};
    if (strcmp(s, "h200") == 0) return RATES_H200;
    double v[4];
    char tail;
    if (sscanf(s, "%lf,%lf,%lf,%lf%c", &v[0], &v[1], &v[2], &v[3], &tail) != 4 ||
        !(v[0] > 0 && v[1] > 0 && v[2] > 0 && v[3] > 0 && isfinite(v[0] + v[1] + v[2] + v[3])))
        cli_usage_error("bench: --rates '%s': expected h200 or four positive numbers "
                        "GEMM_TFLOPS,ATTN_TFLOPS,WEIGHT_GBS,KV_GBS", s);
    return (cost_rates){v[0] * 1e12, v[1] * 1e12, v[2] * 1e9, v[3] * 1e9};
}

static void bench_parse(int argc, char **argv, bench_opts *b) {
    flag_set f;
    flags_parse(&f, SUB_BENCH, argc, argv, 2);
    const flag_val *v = f.v;
    *b = (bench_opts){.model = v[FL_MODEL].s, .format = v[FL_FORMAT].s, .out = v[FL_OUTPUT].s,
                      .device = cli_device(v[FL_DEVICE].s), .weights = cli_weights(v[FL_WEIGHTS].s), .cache_k = v[FL_CACHE_TYPE_K].s,
                      .cache_v = v[FL_CACHE_TYPE_V].s, .ubatch = (int)v[FL_UBATCH].i,
                      .wtype = cli_wtype(v[FL_WTYPE].s), .n_gen = (int)v[FL_N_PREDICT].i,
                      .reps = (int)v[FL_REPEAT].i, .ctx_size = (int)v[FL_CTX].i,
                      .dry_run = v[FL_DRY_RUN].given > 0, .elem_bytes = (int)v[FL_ELEM_BYTES].i,
                      .elem_given = v[FL_ELEM_BYTES].given > 0,
                      .n_ctx = v[FL_N_PROMPT].n, .n_par = v[FL_PARALLEL].n, .n_thr = v[FL_THREADS].n,
                      .so = f.so, .draft_path = f.so.draft_path, .rates_arg = v[FL_RATES].s};
    memcpy(b->ctx, v[FL_N_PROMPT].list, sizeof b->ctx);
    memcpy(b->par, v[FL_PARALLEL].list, sizeof b->par);
    memcpy(b->thr, v[FL_THREADS].list, sizeof b->thr);
    b->threads = b->n_thr ? b->thr[0] : 0;
    b->n_strategies = cli_strategies(v[FL_STRATEGY].s, b->strategies);
    flags_check_strategy_params(&f, b->strategies, b->n_strategies);
    b->prefix = (int)v[FL_BENCH_PREFIX].i;
    if (b->prefix > 0) {   // a reuse row after each strategy's own row, for those that reuse
        int n = b->n_strategies;
        for (int k = 0; k < n; k++) {
            const strategy *s = b->strategies[k], *pre = s->prefill_part ? s->prefill_part : s;
            if (!strategy_chunks(s) && !pre->compresses_prefix) continue;
            if (b->n_strategies == MAX_STRATEGIES)
                cli_usage_error("bench --prefix: more than %d rows", MAX_STRATEGIES);
            b->prefix_row[b->n_strategies] = 1;
            b->strategies[b->n_strategies++] = s;
        }
        if (b->n_strategies == n)
            cli_usage_error("bench --prefix: none of the strategies reuses a shared prefix (full, topk, "
                            "topk+phi, snapkv, streamingllm, fastkv and their compositions do)");
        for (int i = 0; i < b->n_ctx; i++)
            if (b->ctx[i] < b->prefix + PREFIX_REST + 1)
                cli_usage_error("bench --prefix %d: -p %d leaves fewer than %d tokens after it", b->prefix,
                                b->ctx[i], PREFIX_REST + 1);
        for (int i = 0; i < b->n_par; i++)
            if (b->par[i] != 1) cli_usage_error("bench --prefix: with --parallel 1 only");
    }
    // -o was the table's format before it was the output file everywhere: refused, not a file "md"
    static const char *const FORMATS[] = {"md", "json", "jsonl", "csv"};
    for (int i = 0; i < 4 && b->out; i++)
        if (strcmp(b->out, FORMATS[i]) == 0)
            cli_usage_error("-o is the output file now (in every subcommand); for the table's format "
                            "use --format %s", b->out);
    if (b->n_gen < 1) cli_usage_error("bench: -n %d: decode at least one token", b->n_gen);
    if (b->wtype != GGML_F32 && !cli_is_synthetic(b->model))
        cli_usage_error("bench: --wtype applies to synthetic models (a file has its own types)");
    if (b->elem_given && !b->dry_run)
        cli_usage_error("bench: --elem-bytes only applies to --dry-run (a run uses the backend's)");
    if (b->rates_arg && !b->dry_run)
        cli_usage_error("bench: --rates only applies to --dry-run (a run measures its own)");
    b->rates = dry_rates(b->rates_arg, b->device && strcmp(b->device, "cuda") == 0);
    if (b->threads == 0) b->threads = backend_cpu_default_threads(NULL);
    if (b->n_thr == 0) b->thr[0] = b->threads, b->n_thr = 1;
    flags_done(&f);
}

static int out_format(const char *s) {
    return strcmp(s, "json") == 0 ? OUT_JSON : strcmp(s, "jsonl") == 0 ? OUT_JSONL
         : strcmp(s, "csv") == 0  ? OUT_CSV  : OUT_MD;
}

static int max_ctx(const bench_opts *b) {
    int m = 0;
    for (int i = 0; i < b->n_ctx; i++) m = b->ctx[i] > m ? b->ctx[i] : m;
    return m;
}

// The most rows of activations one prefill pass of P tokens holds over b's strategies (--ubatch:
// min(P, U) for those that chunk, P for the others).
static long plan_rows(const bench_opts *b, long P) {
    return strategies_prefill_rows(b->strategies, b->n_strategies, P, b->ubatch, NULL);
}

// ---- dry run: the formulas only ----

// The shape the strategies' costs are stated for (cost_shape): the model, --draft's config and
// decode weights when one is given, and the cache's K and V rows. 0, or 1 after an error line.
static int dry_shape(const bench_opts *b, const model_config *c, model_config *dc, double w_step,
                     int typed, enum kv_type kt, enum kv_type vt, double e, cost_shape *sh) {
    *sh = (cost_shape){.c = c, .weight_bytes = w_step,
                       .k_row = typed ? (double)kv_row_bytes(kt, c->head_dim) : e * c->head_dim,
                       .v_row = typed ? (double)kv_row_bytes(vt, c->head_dim) : e * c->head_dim};
    if (!b->draft_path) return 0;
    char err[512];
    double dw;
    if (cli_config(b->draft_path, dc, err, sizeof err) != 0 ||
        cli_plan_weight_bytes(b->draft_path, b->device, b->weights, b->wtype, &dw, err, sizeof err) != 0) {
        fprintf(stderr, "sift: error: bench: --draft: %s\n", err);
        return 1;
    }
    sh->draft = dc;
    sh->draft_weight_bytes = cost_decode_weight_bytes(dc, 1) * (dw / cost_n_params(dc));
    return 0;
}

static int bench_dry_run(const bench_opts *b, const model_config *c) {
    bench_out o = {out_format(b->format), 0};
    // the memory plan: weights as the backend of --device keeps them (cuda: GGUF blocks or bf16,
    // bf16 KV and activations, no GPU needed; otherwise the CPU's, --weights and --wtype), or
    // every parameter at --elem-bytes when that is given
    const int cuda = b->device && strcmp(b->device, "cuda") == 0, given = b->elem_given;
    double avail = cuda ? NAN : (double)host_mem_available(), weights;
    double e = given ? b->elem_bytes : cuda ? 2 : 4;
    char err[512];
    if (given) weights = cost_n_params(c) * e;
    else if (cli_plan_weight_bytes(b->model, b->device, b->weights, b->wtype, &weights, err,
                                   sizeof err) != 0) {
        fprintf(stderr, "sift: error: %s\n", err);
        return 1;
    }
    const char *name = b->model ? b->model : "default model";
    // the KV cache: --cache-type-k/-v as the backend of --device takes them (auto: f16 on the
    // CPU, bf16 on CUDA, 2 bytes either way); --elem-bytes without a cache type: e bytes
    enum kv_type kt, vt;
    int typed = (b->cache_k && strcmp(b->cache_k, "auto")) ||
                (b->cache_v && strcmp(b->cache_v, "auto")) || !given;
    if (cli_kv_types(b->cache_k, b->cache_v, cuda ? "cuda" : "cpu", cuda ? 2 : 4, &kt, &vt, err,
                     sizeof err) != 0) {   // a cache type the device cannot take: usage, as cli_load
        fprintf(stderr, "sift: error: bench: %s\n", err);
        return 2;
    }
    double kv_tok = typed ? cost_kv_token_bytes_typed(c, kt, vt) : cost_kv_token_bytes(c, (size_t)e);
    if (kv_tok <= 0) {
        fprintf(stderr, "sift: error: bench: a q8_0 KV cache needs a head_dim that is a multiple of "
                "32; this shape has %d\n", c->head_dim);
        return 2;
    }
    char types[32];
    snprintf(types, sizeof types, "%s/%s", typed ? kv_type_name(kt) : e == 2 ? "bf16" : e == 4 ? "f32" : "elem",
             typed ? kv_type_name(vt) : e == 2 ? "bf16" : e == 4 ? "f32" : "elem");
    double w_step = cost_decode_weight_bytes(c, 1) * (weights / cost_n_params(c));
    const cost_rates rt = b->rates;
    cost_shape sh;
    model_config dc = {0};
    if (dry_shape(b, c, &dc, w_step, typed, kt, vt, e, &sh) != 0) return 1;

    for (int i = 0; i < b->n_ctx * b->n_strategies; i++) {
        long P = b->ctx[i / b->n_strategies], R = plan_rows(b, P);
        const strategy *st = b->strategies[i % b->n_strategies];
        // the strategy's work at this length, its predicted times and their ratios to full's
        cost_work wk, wf;
        sh.n = P, sh.n_gen = b->n_gen;
        strategy_cost(st, &sh, &b->so, &wk);
        strategy_cost(strategy_find("full"), &sh, &b->so, &wf);
        double ttft = cost_ttft(&wk, &rt), tpot = cost_tpot(&wk, &rt);
        bench_field f[] = {
            {"model", "model", name, 0, 0, NULL, NULL},
            {"device", "device", cuda ? "cuda" : "cpu", 0, 0, NULL, NULL},
            {"strategy", "strategy", st->name, 0, 0, NULL, NULL},
            {"n_params", "params", NULL, cost_n_params(c), 0, "%.0f", NULL},
            {"elem_bytes", "elem bytes", NULL, e, 0, "%.0f", NULL},
            {"kv_types", "KV K/V", types, 0, 0, NULL, NULL},
            {"n_prompt", "ctx", NULL, (double)P, 0, "%.0f", NULL},
            {"n_gen", "gen", NULL, b->n_gen, 0, "%.0f", NULL},
            {"parallel", "par", NULL, 1, 0, "%.0f", NULL},
            {"prefill_flops", "prefill FLOPs", NULL, cost_prefill_flops(c, P), 0, "%.6e", NULL},
            // the share of the parameters a decode step reads, at the weights' bytes per parameter
            {"decode_weight_bytes", "weight bytes/token", NULL,
             cost_decode_weight_bytes(c, 1) * (weights / cost_n_params(c)), 0, "%.0f", NULL},
            {"kv_token_bytes", "KV bytes/token", NULL, kv_tok, 0, "%.0f", NULL},
            {"kv_bytes", "KV bytes", NULL, (P + b->n_gen) * kv_tok, 0, "%.0f", NULL},
            // rows of activations one prefill pass holds (--ubatch chunks: at most U)
            {"prefill_rows", "prefill rows", NULL, (double)R, 0, "%.0f", NULL},
            {"prefill_mem_bytes", "prefill memory", NULL,
             cost_prefill_mem_bytes_rows(c, P, b->n_gen, R, (size_t)e, kv_tok), 0, "%.0f", NULL},
            {"weight_bytes", "weights", NULL, weights, 0, "%.0f", NULL},
            {"plan_bytes", "plan (weights + prefill)", NULL,
             weights + cost_prefill_mem_bytes_rows(c, P, b->n_gen, R, (size_t)e, kv_tok), 0, "%.0f", NULL},
            // what a decode at this depth holds: the weights and the KV cache (no prefill rows)
            {"decode_plan_bytes", "plan (weights + KV)", NULL, weights + (P + b->n_gen) * kv_tok, 0,
             "%.0f", NULL},
            {"mem_available_bytes", "available", NULL, avail > 0 ? avail : NAN, 0, "%.0f", NULL},
            // the strategy's work by formula (its cost hooks, policies/strategy.h) at the rates
            {"pred_prefill_flops", NULL, NULL, wk.gemm_flops + wk.attn_flops, 0, "%.12e", NULL},
            {"pred_decode_kv_bytes", NULL, NULL, wk.kv_bytes, 0, "%.0f", NULL},
            {"pred_ttft_ms", "TTFT ms (pred)", NULL, 1e3 * ttft, 0, "%.1f", NULL},
            {"pred_tpot_ms", "TPOT ms (pred)", NULL, 1e3 * tpot, 0, "%.2f", NULL},
            {"pred_ttft_x_full", "TTFT x full (pred)", NULL, cost_ttft(&wf, &rt) / ttft, 0, "%.3f", NULL},
            {"pred_tpot_x_full", "TPOT x full (pred)", NULL, cost_tpot(&wf, &rt) / tpot, 0, "%.3f", NULL},
        };
        put_row(&o, f, sizeof f / sizeof *f);
    }
    put_end(&o);
    free(dc.inv_freq);
    return 0;
}

// ---- measuring ----

static void mean_sd(const double *x, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) s += x[i], k++;
    *mean = k ? s / k : NAN;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) q += (x[i] - *mean) * (x[i] - *mean);
    *sd = k > 1 ? sqrt(q / (k - 1)) : k ? 0 : NAN;
}

// Progress on stderr: the cell being measured, and the prefill layer when stderr is a terminal.
typedef struct {
    char cell[160];
    const context *cx;   // its chunked prefill's rows so far (context.prefill_done)
} bench_progress;

static void bench_show_layer(void *ctx, int layer, int n_layer, int rows) {
    const bench_progress *p = ctx;
    if (p->cx->prefill_total)   // a chunked prefill: which rows of the prompt
        fprintf(stderr, "\r%s: prefill rows %ld-%ld of %ld, layer %d/%d   ", p->cell,
                p->cx->prefill_done + 1, p->cx->prefill_done + rows, p->cx->prefill_total, layer + 1, n_layer);
    else
        fprintf(stderr, "\r%s: prefill layer %d/%d (%d row%s)   ", p->cell, layer + 1, n_layer, rows,
                plural_s(rows));
}

static void show_cell(bench_progress *p, int tty, int P, int ci, int n_ctx, int rep, int reps,
                      const char *strategy) {
    snprintf(p->cell, sizeof p->cell, "bench: ctx %d [%d/%d] rep %d/%d %s", P, ci + 1, n_ctx,
             rep + 1, reps, strategy);
    if (flag_verbosity >= 1) fprintf(stderr, tty ? "\r%-70s" : "%s\n", p->cell);
}

// st's device counts into cs->dev_json.
static void counters_text(cell_stats *cs, const run_stats *st) {
    FILE *f = fmemopen(cs->dev_json, sizeof cs->dev_json, "w");
    CHECK_INTERNAL(f, "fmemopen");
    run_stats_counters_json(f, st);
    fputc(0, f);
    fclose(f);
}

// One strategy run on ids (P,) into cell slot rep (prefix: its first tokens' shared prefix, or
// NULL); 0 or -1 (message printed).
static int bench_one(const bench_opts *b, context *cx, const strategy *s, const int *ids, int P,
                     int n_gen, sampler *smp, cell_stats *cs, int rep, const kv_prefix *prefix) {
    run_stats st;
    char err[512];
    strategy_run run = b->run;
    run.prefix = prefix;
    if (run_generate(s, cx, &b->so, &run, ids, P, n_gen, smp, NULL, NULL, &st, NULL, err,
                     sizeof err)) {
        fprintf(stderr, "%ssift: error: bench: %s at ctx %d: %s\n", isatty(2) ? "\n" : "",
                s->name, P, err);
        return -1;
    }
    if (!cs) return 0;
    cs->ttft[rep] = st.prompt_ms;
    cs->hook[rep] = st.hook_ms;
    cs->pp[rep] = per_second(P, st.prompt_ms);
    cs->tpot[rep] = st.decode_runs ? st.decode_ms / st.decode_runs : NAN;
    cs->tg[rep] = st.decode_runs ? per_second(st.decode_runs, st.decode_ms) : NAN;
    cs->kv_bytes = st.kv_bytes;
    cs->kv_read = st.kv_read_per_step;
    cs->rows_done = st.rows_done;
    cs->prefix_n = st.prefix_n;
    counters_text(cs, &st);
    return 0;
}

// Row k's shared prefix of ids (P,), built untimed as a batch job builds one (jobs/prefix.c): N =
// --prefix cut where a prefill may resume (prefix_cut), plain or compressed by k's prefill part.
// NULL + message when it cannot be made.
static kv_prefix *bench_prefix(const bench_opts *b, context *cx, int k, const int *ids, int P) {
    const strategy *s = b->strategies[k], *pre = s->prefill_part ? s->prefill_part : s;
    int chunks = strategy_chunks(s);
    int rows = chunks && (s->phase == PHASE_DECODE || s->decode_part) ? P - 1 : P;
    int n = prefix_cut(b->prefix, rows, cx->p.ubatch);
    char err[512];
    kv_prefix *pf = n < 1 ? NULL : chunks ? prefix_build(cx, ids, n, rows, err, sizeof err)
                                          : prefix_build_with(cx, pre, &b->so, &b->run, ids, n, err, sizeof err);
    if (!pf)
        fprintf(stderr, "%ssift: error: bench: %s at ctx %d: no prefix of %d tokens: %s\n",
                isatty(2) ? "\n" : "", s->name, P, b->prefix, n < 1 ? "too short a prompt" : err);
    return pf;
}

// P seeded random token ids for repetition rep.
static int *random_ids(const model *m, int P, int rep, sampler *smp) {
    int *ids = xmalloc((size_t)P * sizeof(int));
    sampler_init(smp, &(sample_params){.temp = 0, .seed = (uint64_t)rep + 1}, m->cfg.vocab);
    for (int i = 0; i < P; i++) ids[i] = (int)(sample_uniform(smp) * m->cfg.vocab) % m->cfg.vocab;
    return ids;
}

// B sequences of P tokens (ids: B rows) decoded together with s: gen_begin each, then shared
// gen_steps; per-sequence means into slot rep, and the aggregate decode rate. 0 or -1.
static int bench_batch(const bench_opts *b, context *cx, const strategy *s, int *const *ids, int P,
                       int B, cell_stats *cs, int rep) {
    const model *m = cx->m;
    gen_seq *g = xcalloc((size_t)B, sizeof *g), **gp = xcalloc((size_t)B, sizeof *gp);
    sampler *smp = xcalloc((size_t)B, sizeof *smp);
    char err[512];
    int rc = 0, started = 0;
    double ttft = 0, hook = 0;
    for (; started < B && rc == 0; started++) {
        sampler_init(&smp[started], &(sample_params){.temp = 0}, m->cfg.vocab);
        gp[started] = &g[started];
        rc = gen_begin(&g[started], s, cx, &b->so, &b->run, ids[started], P, b->n_gen, &smp[started],
                       NULL, NULL, NULL, err, sizeof err);
        if (rc) {
            fprintf(stderr, "%ssift: error: bench: %s at ctx %d, parallel %d: %s\n", isatty(2) ? "\n" : "",
                    s->name, P, B, err);
            sampler_free(&smp[started]);
        } else
            ttft += g[started].st.prompt_ms, hook += g[started].st.hook_ms;
    }
    if (rc == 0) {
        double t0 = now_ms();
        int steps = 0;
        for (int live = B; live > 0; steps++) {
            gen_step(gp, B);
            live = 0;
            for (int i = 0; i < B; i++) live += !g[i].done;
        }
        double ms = now_ms() - t0;
        cs->ttft[rep] = ttft / B;
        cs->hook[rep] = hook / B;
        cs->pp[rep] = per_second(P, ttft / B);
        cs->tpot[rep] = steps ? ms / steps : NAN;
        cs->tg[rep] = steps ? per_second(steps, ms) : NAN;
        cs->agg[rep] = steps ? per_second(steps * B, ms) : NAN;
        cs->kv_bytes = g[0].st.kv_bytes;
        cs->kv_read = g[0].st.kv_read_per_step;
        cs->rows_done = g[0].st.rows_done;
        counters_text(cs, &g[0].st);
    }
    for (int i = 0; i < B && i < started - (rc != 0); i++) {
        gen_end(&g[i]);
        sampler_free(&smp[i]);
    }
    free(g), free(gp), free(smp);
    return rc;
}

// Every parallel width, strategy and repetition at context P; cells [pi * n_strategies + k].
// 0 or -1.
static int bench_ctx(const bench_opts *b, context *cx, int ci, cell_stats *cs, bench_progress *pr, int tty) {
    const model *m = cx->m;
    int P = b->ctx[ci], rc = 0;
    for (int pi = 0; pi < b->n_par && rc == 0; pi++) {
        int B = b->par[pi];
        for (int r = 0; r < b->reps && rc == 0; r++) {
            sampler smp[FWD_MAX_BATCH];
            int *ids[FWD_MAX_BATCH];
            for (int j = 0; j < B; j++) ids[j] = random_ids(m, P, r + 1000 * j, &smp[j]);
            for (int k = 0; k < b->n_strategies && rc == 0; k++) {
                cell_stats *c = &cs[pi * b->n_strategies + k];
                show_cell(pr, tty, P, ci, b->n_ctx, r, b->reps, b->strategies[k]->name);
                if (B == 1) {
                    kv_prefix *pf = b->prefix_row[k] ? bench_prefix(b, cx, k, ids[0], P) : NULL;
                    rc = b->prefix_row[k] && !pf ? -1
                         : bench_one(b, cx, b->strategies[k], ids[0], P, b->n_gen, &smp[0], c, r, pf);
                    prefix_free(pf);
                    if (rc == 0) c->agg[r] = c->tg[r];
                } else
                    rc = bench_batch(b, cx, b->strategies[k], ids, P, B, c, r);
            }
            for (int j = 0; j < B; j++) sampler_free(&smp[j]), free(ids[j]);
        }
    }
    return rc;
}

typedef struct {
    const char *model_name;
    double peak_tflops, peak_gbs;   // NaN when the backend offers no ceilings
} bench_env;

static void print_cell(const bench_opts *b, const context *cx, const bench_env *env, int P, int B,
                       const cell_stats *cs, int k, const cell_stats *full, const cell_stats *par1,
                       bench_out *o) {
    const model *m = cx->m;
    const model_config *c = &m->cfg;
    int R = b->reps;
    double ttft, ttft_sd, pp, pp_sd, tpot, tpot_sd, tg, tg_sd, fpp = NAN, ftg = NAN, sd;
    mean_sd(cs->ttft, R, &ttft, &ttft_sd);
    mean_sd(cs->pp, R, &pp, &pp_sd);
    mean_sd(cs->tpot, R, &tpot, &tpot_sd);
    mean_sd(cs->tg, R, &tg, &tg_sd);
    if (full) mean_sd(full->pp, R, &fpp, &sd);
    if (full) mean_sd(full->tg, R, &ftg, &sd);
    double agg, agg_sd, agg1 = NAN;
    mean_sd(cs->agg, R, &agg, &agg_sd);
    // the hooks' share of TTFT: their own work on the CPU; on a device their host time only
    // (kernels run asynchronously), so not reported
    double hook, hook_sd;
    mean_sd(cs->hook, R, &hook, &hook_sd);
    if (strcmp(m->bk->name, "cpu") != 0) hook = NAN;
    if (par1) mean_sd(par1->agg, R, &agg1, &sd);
    double flops = cost_prefill_flops(c, P), tflops = flops / (ttft * 1e-3) / 1e12;
    enum kv_type kt, vt;
    fwd_kv_types(cx, &kt, &vt);
    double kv_tok = cost_kv_token_bytes_typed(c, kt, vt);
    double kv_read = fmax(0, (double)cs->kv_bytes - b->n_gen / 2.0 * kv_tok);
    const strategy *s = b->strategies[k];   // a decode strategy counts what its steps read
    if ((s->phase == PHASE_DECODE || s->decode_part) && cs->kv_read > 0) kv_read = cs->kv_read;
    // the weights as loaded (a quantised file reads its blocks), the untied embedding one row
    double dec_bytes = m->weight_bytes - (c->tied ? 0 : m->embd_bytes) + kv_read;
    double gbs = dec_bytes / (tpot * 1e-3) / 1e9;
    bench_field f[] = {
        {"model", "model", env->model_name, 0, 0, NULL, NULL},
        {"strategy", "strategy", b->strategies[k]->name, 0, 0, NULL, NULL},
        {"backend", "backend", m->bk->name, 0, 0, NULL, NULL},
        {"threads", "threads", NULL, b->threads, 0, "%.0f", NULL},
        {"n_prompt", "ctx", NULL, P, 0, "%.0f", NULL},
        {"n_gen", "gen", NULL, b->n_gen, 0, "%.0f", NULL},
        {"parallel", "par", NULL, B, 0, "%.0f", NULL},
        {"reps", NULL, NULL, R, 0, "%.0f", NULL},
        {"ttft_ms", "TTFT ms", NULL, ttft, ttft_sd, "%.1f", "ttft_stddev_ms"},
        {"pp_avg_ts", "pp t/s", NULL, pp, pp_sd, "%.1f", "pp_stddev_ts"},
        {"tpot_ms", "TPOT ms", NULL, tpot, tpot_sd, "%.4g", "tpot_stddev_ms"},
        {"tg_avg_ts", "tg t/s", NULL, tg, tg_sd, "%.2f", "tg_stddev_ts"},
        {"agg_tg_ts", "agg tg t/s", NULL, agg, agg_sd, "%.1f", "agg_tg_stddev_ts"},
        {"agg_x_par1", "agg x par1", NULL, agg / agg1, 0, "%.2f", NULL},
        {"kv_bytes", NULL, NULL, (double)cs->kv_bytes, 0, "%.0f", NULL},
        {"kv_gib", "KV GiB", NULL, cs->kv_bytes / GIB, 0, "%.4f", NULL},
        {"hook_ms", NULL, NULL, hook, 0, "%.1f", NULL},
        {"hook_pct_of_ttft", "hooks % TTFT", NULL, 100 * hook / ttft, 0, "%.1f", NULL},
        {"rows_pct_of_full", "rows %", NULL, 100.0 * cs->rows_done / ((double)P * c->n_layer), 0,
         "%.1f", NULL},
        {"pp_x_full", "pp x full", NULL, pp / fpp, 0, "%.2f", NULL},
        {"tg_x_full", "tg x full", NULL, tg / ftg, 0, "%.2f", NULL},
        {"prefill_flops_full_eq", NULL, NULL, flops, 0, "%.6e", NULL},
        {"prefill_tflops_full_eq", "TFLOP/s (full-eq)", NULL, tflops, 0, "%.4g", NULL},
        {"peak_tflops", NULL, NULL, env->peak_tflops, 0, "%.4g", NULL},
        {"mfu_pct_full_eq", "MFU % (full-eq)", NULL, 100 * tflops / env->peak_tflops, 0, "%.1f", NULL},
        {"decode_bytes_per_token", NULL, NULL, dec_bytes, 0, "%.6e", NULL},
        {"decode_gbs", "GB/s", NULL, gbs, 0, "%.2f", NULL},
        {"peak_gbs", NULL, NULL, env->peak_gbs, 0, "%.2f", NULL},
        {"mbu_pct", "MBU %", NULL, 100 * gbs / env->peak_gbs, 0, "%.1f", NULL},
        {"kv_read_mib", "KV read MiB", NULL, kv_read / 1048576, 0, "%.1f", NULL},
        {"roofline_ms", "roofline ms", NULL, dec_bytes / env->peak_gbs / 1e6, 0, "%.4g", NULL},
        {"device_counters", NULL, cs->dev_json[0] ? cs->dev_json : "null", 0, 0, FIELD_JSON, NULL},
        {"prefix_tokens", "prefix", NULL, cs->prefix_n, 0, "%.0f", NULL},   // --prefix rows
    };
    put_row(o, f, sizeof f / sizeof *f);
}

// ---- checks before measuring ----

// Context lengths against the model, before anything is loaded; 0 or 2 (message printed).
static int check_ctx(const bench_opts *b, const model_config *c) {
    long need = (long)max_ctx(b) + b->n_gen;
    int limit = b->ctx_size > 0 ? b->ctx_size : c->ctx_len;
    if (need <= limit) return 0;
    fprintf(stderr, "sift: error: bench: -p %d + -n %d = %ld tokens exceed the %s of %d (with -n %d "
                    "the largest -p is %d)\n", max_ctx(b), b->n_gen, need,
            b->ctx_size > 0 ? "context size -c" : "model's context", limit, b->n_gen, limit - b->n_gen);
    return 2;
}

// The largest prefill's KV cache and activations against the memory left after loading, as the
// backend reports it; 0 or 1 (message printed).
static int check_memory(const bench_opts *b, const context *cx) {
    const model *m = cx->m;
    double avail = m->bk->mem_available ? (double)m->bk->mem_available(m->bk) : -1;
    if (avail <= 0) return 0;
    int P = max_ctx(b);
    int B = 1;   // --parallel: that many caches at once
    for (int k = 0; k < b->n_par; k++) B = b->par[k] > B ? b->par[k] : B;
    enum kv_type kt, vt;
    fwd_kv_types(cx, &kt, &vt);
    double kv_tok = cost_kv_token_bytes_typed(&m->cfg, kt, vt);
    double kv = (double)B * (P + b->n_gen) * kv_tok;
    double need = cost_prefill_mem_bytes_rows(&m->cfg, P, b->n_gen, plan_rows(b, P),
                                              m->bk->elem_bytes, kv_tok) + kv / B * (B - 1);
    if (need <= avail) return 0;
    fprintf(stderr, "sift: error: bench: ctx %d needs %.2f GiB (KV cache %.2f GiB + activations "
                    "%.2f GiB) but only %.2f GiB of memory is available after loading the model\n",
            P, need / GIB, kv / GIB, (need - kv) / GIB, avail / GIB);
    return 1;
}

static void measure_ceilings(backend *bk, bench_env *env) {
    env->peak_tflops = env->peak_gbs = NAN;
    if (!bk->ceilings) return;
    if (bk->info[0] && flag_verbosity >= 1) fprintf(stderr, "bench: %s: %s\n", bk->name, bk->info);
    if (flag_verbosity >= 1) fprintf(stderr, "bench: measuring the %s ceilings (GEMM peak, read bandwidth)...\n", bk->name);
    double tf, gb;
    if (bk->ceilings(bk, &tf, &gb) != 0) return;
    env->peak_tflops = tf;
    env->peak_gbs = gb;
    if (flag_verbosity >= 1) fprintf(stderr, "bench: ceilings on %s: %.3f TFLOP/s GEMM peak, %.1f GB/s read\n", bk->name, tf, gb);
}

// Per strategy: its repetitions' slots in one block (freed by the caller through cs[0].ttft).
static cell_stats *cells_alloc(int n_cells, int reps) {
    cell_stats *cs = xcalloc((size_t)n_cells, sizeof *cs);
    double *mem = xcalloc((size_t)n_cells * 6 * reps, sizeof *mem);
    for (int k = 0; k < n_cells; k++) {
        double *p = mem + (size_t)k * 6 * reps;
        cs[k] = (cell_stats){.ttft = p, .pp = p + reps, .tpot = p + 2 * reps, .tg = p + 3 * reps,
                             .agg = p + 4 * reps, .hook = p + 5 * reps};
    }
    return cs;
}

static int bench_run(const bench_opts *b, loaded *L) {
    model *m = L->m;
    context *cx = L->cx;
    bench_env env = {m->name ? m->name : cli_base_name(L->path), NAN, NAN};
    int tty = isatty(2) && flag_verbosity >= 1, rc = check_memory(b, cx), full = -1;
    bench_progress pr = {"", cx};
    if (tty) {
        cx->on_layer = bench_show_layer;
        cx->on_layer_ctx = &pr;
    }
    char err[512];
    int warm = b->ctx[0] < 32 ? b->ctx[0] : 32;
    snprintf(pr.cell, sizeof pr.cell, "bench: warm-up");
    if (rc == 0 && (rc = run_warm_up(b->strategies[0], cx, &b->so, &b->run, warm, err, sizeof err)))
        fprintf(stderr, "%ssift: error: bench: %s at ctx %d: %s\n", tty ? "\n" : "",
                b->strategies[0]->name, warm, err);
    for (int k = 0; k < b->n_strategies; k++)   // the reference: full's own row (not its reuse row)
        if (!b->prefix_row[k] && strcmp(b->strategies[k]->name, "full") == 0) full = k;
    bench_out o = {out_format(b->format), 0};
    int ns = b->n_strategies, p1 = -1;
    for (int pi = 0; pi < b->n_par; pi++)
        if (b->par[pi] == 1 && p1 < 0) p1 = pi;
    cell_stats *cs = cells_alloc(ns * b->n_par, b->reps);
    for (int ti = 0; ti < b->n_thr && rc == 0; ti++) {   // -t T,...: the whole table per count
        bench_opts bt = *b;
        bt.threads = b->thr[ti];
        omp_set_num_threads(bt.threads);   // the CPU backend's threads (a GPU's host side)
        measure_ceilings(m->bk, &env);
        for (int ci = 0; ci < bt.n_ctx && rc == 0; ci++) {
            rc = bench_ctx(&bt, cx, ci, cs, &pr, tty);
            if (tty) fprintf(stderr, "\r%90s\r", "");
            for (int pi = 0; pi < bt.n_par && rc == 0; pi++)
                for (int k = 0; k < ns && rc == 0; k++)
                    print_cell(&bt, cx, &env, bt.ctx[ci], bt.par[pi], &cs[pi * ns + k], k,
                               full >= 0 ? &cs[pi * ns + full] : NULL,
                               p1 >= 0 ? &cs[p1 * ns + k] : NULL, &o);
        }
    }
    put_end(&o);
    if (m->bk->report && flag_verbosity >= 1) m->bk->report(m->bk, stderr);   // choices the backend made by timing
    long fixed, recorded, replayed;
    fwd_decode_counts(cx, &fixed, &recorded, &replayed);
    if (fixed && flag_verbosity >= 1)   // how the decode steps ran (model/decode.c fwd_decode): a device run's context
        fprintf(stderr, "bench: %ld decode step%s through fixed buffers: %ld recorded as graph%s, %ld "
                "replayed%s\n", fixed, plural_s(fixed), recorded, plural_s(recorded), replayed,
                recorded ? "" : " (SIFT_CUDA_GRAPHS=0, or no step ran twice on the same caches)");
    free(cs[0].ttft);
    free(cs);
    return rc ? 1 : 0;
}

int cmd_bench(int argc, char **argv) {
    bench_opts b;
    bench_parse(argc, argv, &b);
    model_config c;
    char err[512];
    if (cli_config(b.model, &c, err, sizeof err) != 0) {
        fprintf(stderr, "sift: error: %s\n", err);
        return 1;
    }
    int rc = check_ctx(&b, &c);
    if (rc == 0 && cli_check_outputs(&b.out, (const char *[]){"-o"}, 1)) rc = 2;   // as sift run's
    if (rc == 0 && cli_stdout_to(b.out)) rc = 1;
    if (rc == 0 && b.dry_run) rc = bench_dry_run(&b, &c);
    free(c.inv_freq);
    if (b.dry_run || rc) return rc;
    loaded L;
    cli_hw hw = {b.device, b.threads, b.weights, b.ctx_size, b.wtype, b.cache_k, b.cache_v, b.ubatch};
    rc = cli_load(&L, b.model, b.draft_path, &hw, b.strategies, b.n_strategies, &b.so, &b.run);
    if (rc == 0) rc = bench_run(&b, &L);
    cli_unload(&L);
    return rc;
}
