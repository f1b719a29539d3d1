// cmd/sweep.c — `sift sweep`: which strategy, with which settings, keeps the user's answers while
// going fastest? On the user's prompts (-f, --batch, --prompts) or on `sift eval`'s generated
// tasks, run `full` once per prompt as the reference, then every setting of a grid (strategies x
// parameter values) greedily on the same tokens; aggregate fidelity (first-token and greedy
// agreement, KL of the first token, task accuracy) and speed (TTFT, TPOT, ratios against full)
// per setting; report the Pareto frontier of fidelity against speedup as a table, JSON, CSV and
// an SVG scatter, and with --min-agreement the command line of the fastest setting that keeps it.
// Ctrl-C stops between runs and reports what was measured (exit 130).
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../eval/eval.h"
#include "../eval/pareto.h"
#include "../util/check.h"
#include "cmd.h"
#include "flags.h"

#define SWEEP_MAX_SETTINGS 256
#define SWEEP_MAX_PARAMS 8
#define SWEEP_MAX_VALUES 16

enum { SW_FID_GREEDY, SW_FID_FIRST, SW_FID_ACCURACY };
enum { SW_SPEED_TOTAL, SW_SPEED_TTFT, SW_SPEED_TPOT };
static const char *const SW_FIDELITY[] = {"greedy", "first", "accuracy"};
static const char *const SW_SPEED[] = {"total", "ttft", "tpot"};

// The default grid, one entry per line of docs/usage.md's list; %d: speed's depths ceil(0.75 L) and
// ceil(0.875 L); %s: the separate draft (draft-layers=L, or draft=MODEL with --draft). A
// strategy strategy_find does not know (a composition not built yet) is skipped with a note.
static const char *const SW_DEFAULT_GRID[] = {
    "speed:speed-depth=%d,%d", "fastkv:kv-rate=0.05,0.1,0.2", "specprefill:keep=0.1,0.3",
    "specprefill:keep=0.1,0.3:%s", "topk:budget=0.02,0.05", "topk:selector=pages:page-size=16,32",
    "topk+phi:budget=0.02", "topk+phi:selector=pages", "fastkv+topk", "specprefill+topk+phi:budget=0.02"};
#define SW_N_DEFAULT (int)(sizeof SW_DEFAULT_GRID / sizeof *SW_DEFAULT_GRID)

// Is name (n chars) a strategy of the default grid?
static int sw_in_default(const char *name, size_t n) {
    for (int i = 0; i < SW_N_DEFAULT; i++)
        if (strcspn(SW_DEFAULT_GRID[i], ":") == n && strncmp(SW_DEFAULT_GRID[i], name, n) == 0) return 1;
    return 0;
}

typedef struct sweep_setting {
    const strategy *s;
    char grid[256];       // "kv-rate=0.1 tsp-rate=0.2" ("": the strategy's defaults)
    char flags[512];      // the same as command-line flags: " --kv-rate 0.1 --tsp-rate 0.2"
    strategy_opts so;     // the base options with these values
    strategy_run run;     // the draft (when these options name one) and end-of-generation test
} sweep_setting;

typedef struct sweep_opts {
    const char *model, *device, *draft_path, *grid, *only, *json_path, *csv_path, *plot_path,
        *haystack, *batch_dir;
    enum bk_weights weights;
    const char *cache_k, *cache_v;   // --cache-type-k/-v (kvrow.h names; "auto": cli_kv_default)
    int ubatch;                       // --ubatch: rows of one prefill pass (0: one pass)
    run_opts r;                       // the user's prompts: -f, --batch, --prompts, --chat, --system
    int tasks[EVAL_N_TASKS], n_tasks; // --tasks (0: the user's prompts)
    int ctx, samples;                 // ctx: --n-prompt, the tasks' prompt length
    int ctx_size;                     // -c: the longest prompt + answer (0: the model's)
    unsigned long long seed;
    int n_predict, threads, threads_given, parallel, quiet, fidelity, speed;
    double min_agreement;             // < 0: not asked
    strategy_opts so;                 // the base every setting starts from
    char base_flags[512];             // the strategy flags given outside --grid, as given
    sweep_setting *set;               // set[0]: full, the reference
    int n_set;
    char **strs;                      // strings the settings point into (--grid values)
    int n_strs;
} sweep_opts;

// ---- the grid ----

static char *sw_keep(sweep_opts *w, const char *s, size_t n) {
    w->strs = xrealloc(w->strs, (size_t)(w->n_strs + 1) * sizeof *w->strs);
    char *c = xmalloc(n + 1);
    memcpy(c, s, n);
    c[n] = 0;
    return w->strs[w->n_strs++] = c;
}

// s without its leading and trailing blanks (in place)
static char *sw_trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
    return s;
}

// The parameters strategy s reads, "a, b, c", for errors.
static const char *sw_params_of(const char *name) {
    static char buf[400];
    int n;
    const opt_def *t = strategy_opts_table(&n);
    buf[0] = 0;
    for (int i = 0; i < n; i++)
        if (strategy_opt_used_by(&t[i], name) && strlen(buf) + strlen(t[i].flag) + 3 < sizeof buf)
            strcat(strcat(buf, buf[0] ? ", " : ""), t[i].flag + 2);
    return buf[0] ? buf : "none";
}

// A word is safe in a shell as it is; else it is single-quoted.
static void sw_quote(char *out, size_t len, const char *s) {
    if (s[0] && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./+=:,@%-") == strlen(s)) {
        snprintf(out, len, "%s", s);
        return;
    }
    size_t j = 0;
    out[j++] = '\'';
    for (; *s && j + 5 < len; s++)
        if (*s == '\'') j += (size_t)snprintf(out + j, len - j, "'\\''");
        else out[j++] = *s;
    out[j++] = '\'';
    out[j] = 0;
}

typedef struct {
    const opt_def *d;
    const char *v[SWEEP_MAX_VALUES];
    int n;
} sw_param;

// One --grid entry NAME[:PARAM=V,...]... (in place) into settings; skip_unknown: a strategy this
// build lacks is a note, not an error.
static void sw_parse_entry(sweep_opts *w, char *entry, int skip_unknown) {
    char *colon = strchr(entry, ':'), *save = NULL;
    if (colon) *colon = 0;
    char *name = sw_trim(entry);
    if (!*name) cli_usage_error("--grid: an empty strategy entry (entries are separated by ';')");
    const strategy *s = strategy_find(name);
    if (!s && skip_unknown) {
        if (!w->quiet) fprintf(stderr, "sift: sweep: skipping %s (not a strategy of this build)\n", name);
        return;
    }
    if (!s && strategy_refusal(name)) cli_usage_error("--grid: strategy %s", strategy_refusal(name));
    if (!s) cli_usage_error("--grid: unknown strategy '%s' (available: %s; or PREFILL+DECODE)", name,
                            strategy_names());
    if (strcmp(s->name, "full") == 0)
        cli_usage_error("--grid: full is the reference and always runs; leave it out of the grid");
    sw_param p[SWEEP_MAX_PARAMS];
    int np = 0;
    long count = 1;
    for (char *t = colon ? strtok_r(colon + 1, ":", &save) : NULL; t; t = strtok_r(NULL, ":", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) cli_usage_error("--grid: '%s' after %s is not PARAM=VALUE[,VALUE...]", sw_trim(t), name);
        *eq = 0;
        char flag[64], *key = sw_trim(t);
        snprintf(flag, sizeof flag, "--%s", key);
        const opt_def *d = strategy_opt_find(flag);
        if (!d) cli_usage_error("--grid: unknown parameter '%s' (strategy flags without --, e.g. kv-rate)", key);
        if (!strategy_opt_used_by(d, s->name))
            cli_usage_error("--grid: %s does not read '%s' (it reads: %s)", s->name, key, sw_params_of(s->name));
        for (int i = 0; i < np; i++)
            if (p[i].d == d) cli_usage_error("--grid: %s: '%s' given twice", name, key);
        if (np == SWEEP_MAX_PARAMS) cli_usage_error("--grid: %s: more than %d parameters", name, SWEEP_MAX_PARAMS);
        sw_param *q = &p[np++];
        *q = (sw_param){.d = d};
        char *vsave = NULL;
        for (char *v = strtok_r(eq + 1, ",", &vsave); v; v = strtok_r(NULL, ",", &vsave)) {
            v = sw_trim(v);
            if (q->n == SWEEP_MAX_VALUES) cli_usage_error("--grid: %s: more than %d values", key, SWEEP_MAX_VALUES);
            strategy_opts scratch = w->so;
            char err[256];
            if (!*v || strategy_opt_set(&scratch, d, v, err, sizeof err))
                cli_usage_error("--grid: %s: %s", name, *v ? err : "an empty value");
            if (d->offset == offsetof(strategy_opts, draft_path)) {
                if (w->draft_path && strcmp(w->draft_path, v) != 0)
                    cli_usage_error("--grid: one draft model per sweep (got '%s' and '%s')", w->draft_path, v);
                w->draft_path = sw_keep(w, v, strlen(v));
            }
            q->v[q->n++] = sw_keep(w, v, strlen(v));
        }
        if (q->n == 0) cli_usage_error("--grid: %s: '%s' has no value", name, key);
        count *= q->n;
    }
    if (w->n_set + count > SWEEP_MAX_SETTINGS)
        cli_usage_error("--grid: more than %d settings", SWEEP_MAX_SETTINGS - 1);
    for (long k = 0; k < count; k++) {   // the cross product, the last parameter fastest
        sweep_setting *x = &w->set[w->n_set];
        *x = (sweep_setting){.s = s, .so = w->so};
        long rest = k;
        for (int i = np - 1; i >= 0; i--) {
            const char *v = p[i].v[rest % p[i].n];
            rest /= p[i].n;
            char err[256], quoted[300];
            if (strategy_opt_set(&x->so, p[i].d, v, err, sizeof err)) cli_usage_error("--grid: %s", err);
            sw_quote(quoted, sizeof quoted, v);
            char g[256], f[512];
            if (snprintf(g, sizeof g, "%s=%s%s%s", p[i].d->flag + 2, v, x->grid[0] ? " " : "", x->grid) >= (int)sizeof g ||
                snprintf(f, sizeof f, " %s %s%s", p[i].d->flag, quoted, x->flags) >= (int)sizeof f)
                cli_usage_error("--grid: %s: the values of one setting are too long", name);
            memcpy(x->grid, g, sizeof g);
            memcpy(x->flags, f, sizeof f);
        }
        for (int i = 1; i < w->n_set; i++)
            if (w->set[i].s == s && strcmp(w->set[i].grid, x->grid) == 0)
                cli_usage_error("--grid: %s %s given twice", s->name, x->grid[0] ? x->grid : "(defaults)");
        w->n_set++;
    }
}

// --grid SPEC (or the default grid's text) into w->set after full.
static void sw_parse_grid(sweep_opts *w, const char *spec, int skip_unknown) {
    char *at = sw_keep(w, spec, strlen(spec));   // kept with the grid's strings: an error exits
    for (;;) {
        char *semi = strchr(at, ';');
        if (semi) *semi = 0;
        sw_parse_entry(w, at, skip_unknown);
        if (!semi) break;
        at = semi + 1;
    }
}

// Does the comma list `only` name name (n chars)?
static int sw_wanted(const char *only, const char *name, size_t n) {
    for (const char *p = only; *p;) {
        size_t k = strcspn(p, ",");
        if (k == n && strncmp(p, name, n) == 0) return 1;
        p += k + (p[k] == ',');
    }
    return 0;
}

// The default grid for a model of n_layer layers, restricted to --strategy's names; a name
// there outside the default grid runs with its defaults.
static void sw_default_grid(sweep_opts *w, int n_layer) {
    char draft[600], e[800];
    if (w->draft_path) snprintf(draft, sizeof draft, "draft=%s", w->draft_path);
    else snprintf(draft, sizeof draft, "draft-layers=%d", n_layer);
    for (int i = 0; i < SW_N_DEFAULT; i++) {
        const char *f = SW_DEFAULT_GRID[i];
        size_t k = strcspn(f, ":");
        if (w->only && !sw_wanted(w->only, f, k)) continue;
        if (strstr(f, "%d")) snprintf(e, sizeof e, f, (3 * n_layer + 3) / 4, (7 * n_layer + 7) / 8);
        else if (strstr(f, "%s")) snprintf(e, sizeof e, f, draft);
        else snprintf(e, sizeof e, "%s", f);
        sw_parse_grid(w, e, 1);
    }
    for (const char *p = w->only; p && *p;) {
        size_t k = strcspn(p, ",");
        if (!sw_in_default(p, k) && !(k == 4 && strncmp(p, "full", 4) == 0)) {
            snprintf(e, sizeof e, "%.*s", (int)k, p);
            sw_parse_grid(w, e, 0);
        }
        p += k + (p[k] == ',');
    }
}

// ---- flags ----

static void sweep_parse(int argc, char **argv, sweep_opts *w) {
    flag_set f;
    flags_parse(&f, SUB_SWEEP, argc, argv, 2);
    const flag_val *v = f.v;
    *w = (sweep_opts){.model = v[FL_MODEL].s, .device = cli_device(v[FL_DEVICE].s),
                      .weights = cli_weights(v[FL_WEIGHTS].s), .cache_k = v[FL_CACHE_TYPE_K].s,
                      .cache_v = v[FL_CACHE_TYPE_V].s, .ubatch = (int)v[FL_UBATCH].i, .batch_dir = v[FL_BATCH].s,
                      .ctx = (int)v[FL_N_PROMPT].i, .ctx_size = (int)v[FL_CTX].i,
                      .samples = (int)v[FL_SAMPLES].i, .seed = (unsigned long long)v[FL_SEED].i,
                      .haystack = v[FL_HAYSTACK].s, .grid = v[FL_GRID].s, .only = v[FL_STRATEGY].s,
                      .draft_path = f.so.draft_path, .n_predict = (int)v[FL_N_PREDICT].i,
                      .fidelity = (int)v[FL_FIDELITY].i, .speed = (int)v[FL_SPEED].i,
                      .min_agreement = v[FL_MIN_AGREE].given ? v[FL_MIN_AGREE].f : -1,
                      .json_path = v[FL_OUTPUT].s, .csv_path = v[FL_CSV].s, .plot_path = v[FL_PLOT].s,
                      .parallel = (int)v[FL_PARALLEL].i, .threads = (int)v[FL_THREADS].i,
                      .threads_given = v[FL_THREADS].given > 0, .quiet = flag_verbosity == 0, .so = f.so};
    w->so.draft_path = NULL;   // --draft is the grid's draft model (specprefill's entry), not a base
    w->r = (run_opts){.so = &w->so, .prompts_path = v[FL_PROMPTS].s, .system = v[FL_SYSTEM].s,
                      .chat = v[FL_CHAT].given || v[FL_SYSTEM].s};
    for (int i = 0; i < f.n_files; i++) jobs_add_file(&w->r, f.files[i]);
    w->set = xcalloc(SWEEP_MAX_SETTINGS, sizeof *w->set);
    if (v[FL_TASKS].s) w->n_tasks = cli_tasks(v[FL_TASKS].s, w->tasks);
    int task_flags = v[FL_N_PROMPT].given + v[FL_SAMPLES].given + v[FL_SEED].given + v[FL_HAYSTACK].given;
    if (w->n_predict < 1) cli_usage_error("sweep: -n %d: generate at least one token", w->n_predict);
    if (w->ctx < 64) cli_usage_error("--n-prompt %d: a task prompt is at least 64 tokens", w->ctx);
    if (v[FL_SEED].i < 0) cli_usage_error("--seed -1 (random) is sift run's; sweep's prompts come from a fixed seed");
    for (int k = 0; k < f.n_sp; k++) {   // the base strategy flags, as given (the printed command line)
        if (f.sp[k].d->offset == offsetof(strategy_opts, draft_path)) continue;
        char q[300];
        size_t used = strlen(w->base_flags);
        sw_quote(q, sizeof q, f.sp[k].v);
        snprintf(w->base_flags + used, sizeof w->base_flags - used, " %s %s", f.sp[k].d->flag, q);
    }
    int user = w->r.n_files > 0 || w->batch_dir || w->r.prompts_path;
    if (!user && !w->n_tasks)
        cli_usage_error("sweep: no prompts: give -f FILE, --batch DIR, --prompts FILE.jsonl or --tasks LIST");
    if (user && w->n_tasks) cli_usage_error("sweep: --tasks generates its prompts: leave out -f, --batch and --prompts");
    if (!w->n_tasks && task_flags) cli_usage_error("sweep: --n-prompt, --samples, --seed and --haystack go with --tasks");
    if (w->n_tasks && w->r.chat) cli_usage_error("sweep: --tasks prompts come in the chat template already (no --chat, --system)");
    if (w->fidelity == SW_FID_ACCURACY && !w->n_tasks)
        cli_usage_error("sweep: --fidelity accuracy needs known answers (--tasks)");
    if (w->grid && w->only) cli_usage_error("sweep: --grid and --strategy exclude each other (--strategy picks from the default grid)");
    if (w->plot_path && !cli_ends_with(w->plot_path, ".svg"))
        cli_usage_error("--plot %s: only SVG is written (name the file .svg)", w->plot_path);
    if (w->draft_path && w->draft_path[strcspn(w->draft_path, ";:,")])
        cli_usage_error("sweep: --draft %s: a path with ';', ':' or ',' cannot be a grid value", w->draft_path);
    if (w->only)
        for (const char *p = w->only; *p || p == w->only;) {   // each name known or in the default grid
            size_t k = strcspn(p, ",");
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)k, p);
            if (k == 0 || k >= sizeof name || !(strategy_find(name) || sw_in_default(p, k)))
                cli_usage_error("sweep: --strategy: unknown strategy '%s' (available: %s)", name, strategy_names());
            if (!p[k]) break;
            p += k + 1;
        }
    char err[512];
    if (w->batch_dir && jobs_add_batch_dir(&w->r, w->batch_dir, err, sizeof err)) cli_usage_error("%s", err);
    if (w->threads == 0) w->threads = backend_cpu_default_threads(NULL);
    w->set[0] = (sweep_setting){.s = strategy_find("full"), .so = w->so};
    w->n_set = 1;
    if (w->grid) sw_parse_grid(w, w->grid, 0);
    // the strategies the sweep may run: the grid's, else --strategy's, else the default grid's;
    // a strategy flag none of them reads is said (it would change no setting)
    const strategy *may[SWEEP_MAX_SETTINGS];
    int n_may = 0;
    for (int i = 1; i < w->n_set; i++) may[n_may++] = w->set[i].s;
    for (int i = 0; !w->grid && i < (w->only ? 1 : SW_N_DEFAULT); i++) {
        char names[300];
        snprintf(names, sizeof names, "%s", w->only ? w->only : SW_DEFAULT_GRID[i]);
        if (!w->only) names[strcspn(names, ":")] = 0;
        char *save = NULL;
        for (char *t = strtok_r(names, ",", &save); t && n_may < SWEEP_MAX_SETTINGS; t = strtok_r(NULL, ",", &save))
            if (strategy_find(t)) may[n_may++] = strategy_find(t);
    }
    if (n_may) flags_check_strategy_params(&f, may, n_may);
    flags_done(&f);
}

static void sweep_free(sweep_opts *w) {
    for (int i = 0; i < w->r.n_files; i++) free(w->r.files[i]);
    free(w->r.files);
    for (int i = 0; i < w->n_strs; i++) free(w->strs[i]);
    free(w->strs);
    free(w->set);
    memset(w, 0, sizeof *w);
}

// ---- measuring ----

typedef struct sweep_prompt {
    char *id;
    int *ids, n_ids;
    char answers[EVAL_MAX_ANSWERS][32];
    int n_answers;            // 0: no known answer (the user's prompts)
} sweep_prompt;

// One setting on one prompt.
typedef struct sweep_rec {
    int state;                // 0 not run (interrupted), 1 measured, -1 failed (note: why)
    int first_agree, n_gen;
    double greedy, kl, score; // score: NaN without known answers
    double ttft_ms, tpot_ms;  // tpot: NaN when no decode step ran
    double kv_bytes, kv_read, rows_pct;
    char label[96];
    char note[300];
} sweep_rec;

typedef struct sweep_run {
    sweep_opts *w;
    loaded *L;
    sweep_prompt *p;
    int n_p;
    sweep_rec *recs;          // [prompt * n_set + setting]
    float *logits;            // (parallel + 1, vocab): slot 0 is full's
    tok_answer full;
    int done, total, failed;
    double t0;
} sweep_run;

static void sw_progress(sweep_run *R, int pi, int si) {
    const sweep_opts *w = R->w;
    if (w->quiet) return;
    double left = R->done ? (now_ms() - R->t0) / R->done * (R->total - R->done) / 1000 : 0;
    if (isatty(2)) {
        int bar = 30 * R->done / R->total;
        fprintf(stderr, "\rsweep [%.*s%.*s] %d/%d runs, prompt %d/%d, ETA %dm%02ds   ", bar,
                "##############################", 30 - bar, "..............................",
                R->done, R->total, pi + 1, R->n_p, (int)left / 60, (int)left % 60);
        if (R->done == R->total) fprintf(stderr, "\n");
        return;
    }
    const sweep_setting *x = &w->set[si];
    const sweep_rec *r = &R->recs[(size_t)pi * w->n_set + si];
    if (r->state < 0)
        fprintf(stderr, "sweep: %s %s %s: failed: %s (%d/%d runs, ETA %dm%02ds)\n", R->p[pi].id,
                x->s->name, x->grid, r->note, R->done, R->total, (int)left / 60, (int)left % 60);
    else
        fprintf(stderr, "sweep: %s %s%s%s: greedy agreement %.2f, TTFT %.0f ms (%d/%d runs, ETA %dm%02ds)\n",
                R->p[pi].id, x->s->name, x->grid[0] ? " " : "", x->grid, r->greedy, r->ttft_ms,
                R->done, R->total, (int)left / 60, (int)left % 60);
}

// The figures of run k (its answer a, its first-token logits) against full's on prompt p.
static void sw_record(sweep_run *R, const sweep_prompt *p, const gen_seq *g, const tok_answer *a,
                      const float *logits, sweep_rec *r) {
    const run_stats *st = &g->st;
    int vocab = R->L->m->cfg.vocab, n_layer = R->L->m->cfg.n_layer;
    r->state = 1;
    r->n_gen = a->n_ids;
    r->greedy = tok_agreement(R->full.ids, R->full.n_ids, a->ids, a->n_ids, &r->first_agree);
    r->kl = eval_kl(R->logits, logits, vocab);
    r->score = p->n_answers ? eval_score(p->answers, p->n_answers, a->text ? a->text : "") : NAN;
    r->ttft_ms = st->prompt_ms;
    r->tpot_ms = st->decode_runs ? st->decode_ms / st->decode_runs : NAN;
    r->kv_bytes = (double)st->kv_bytes;
    r->kv_read = st->kv_read_per_step;
    r->rows_pct = st->prompt_n ? 100.0 * st->rows_done / ((double)st->prompt_n * n_layer) : 0;
    snprintf(r->label, sizeof r->label, "%s", st->label);
    memcpy(r->note, st->note, sizeof r->note - 1);   // truncated, always terminated
    r->note[sizeof r->note - 1] = 0;
}

// Settings [s0, s1) of prompt pi as one batch (one setting when sequential). Full (setting 0)
// always comes first, alone or in the first batch. 0, or -1 when full failed.
static int sw_batch(sweep_run *R, int pi, int s0, int s1) {
    sweep_opts *w = R->w;
    model *m = R->L->m;
    const sweep_prompt *p = &R->p[pi];
    int k = s1 - s0, vocab = m->cfg.vocab;
    gen_seq g[FWD_MAX_BATCH], *live[FWD_MAX_BATCH];
    sampler smp[FWD_MAX_BATCH];
    tok_answer a[FWD_MAX_BATCH];
    int nl = 0, rc = 0;
    for (int i = 0; i < k; i++) {
        sweep_rec *r = &R->recs[(size_t)pi * w->n_set + s0 + i];
        const sweep_setting *x = &w->set[s0 + i];
        char err[300];
        a[i] = (tok_answer){.t = R->L->t};
        sampler_init(&smp[i], &(sample_params){.temp = 0}, vocab);
        float *lg = R->logits + (size_t)(s0 + i == 0 ? 0 : 1 + i) * vocab;
        if (gen_begin(&g[i], x->s, R->L->cx, &x->so, &x->run, p->ids, p->n_ids, w->n_predict, &smp[i],
                      tok_answer_token, &a[i], lg, err, sizeof err)) {
            r->state = -1;
            snprintf(r->note, sizeof r->note, "%s", err);
            continue;
        }
        live[nl++] = &g[i];
    }
    while (nl > 0) {
        int any = 0;
        for (int i = 0; i < nl; i++) any |= !live[i]->done;
        if (!any) break;
        gen_step(live, nl);
    }
    for (int i = 0; i < k; i++) {
        sweep_rec *r = &R->recs[(size_t)pi * w->n_set + s0 + i];
        if (r->state == 0 && s0 == 0 && i > 0 && R->recs[(size_t)pi * w->n_set].state < 0)
            gen_end(&g[i]);   // full failed in this batch: nothing to compare with
        else if (r->state == 0) {
            gen_end(&g[i]);
            if (s0 + i == 0) {   // full: the reference of this prompt
                tok_answer_free(&R->full);
                R->full = a[i];
                a[i] = (tok_answer){0};
            }
            sw_record(R, p, &g[i], s0 + i == 0 ? &R->full : &a[i],
                      R->logits + (size_t)(s0 + i == 0 ? 0 : 1 + i) * vocab, r);
        }
        if (r->state < 0) R->failed++;
        if (s0 + i == 0 && r->state < 0) rc = -1;
        sampler_free(&smp[i]);
        tok_answer_free(&a[i]);
        R->done++;
        sw_progress(R, pi, s0 + i);
    }
    return rc;
}

// Every prompt, full first, then the settings (--parallel at a time). 0, or 1 (interrupted).
static int sw_run_all(sweep_run *R) {
    const sweep_opts *w = R->w;
    R->total = R->n_p * w->n_set;
    char err[512];   // an unmeasured full run first, so that full's (the reference) is not slowed
    (void)run_warm_up(w->set[0].s, R->L->cx, &w->set[0].so, &w->set[0].run, 32, err, sizeof err);
    R->t0 = now_ms();
    for (int pi = 0; pi < R->n_p; pi++) {
        int at = 0;
        if (w->parallel == 1) {   // full alone, then one setting at a time
            if (cli_interrupted) return 1;
            at = 1;
            if (sw_batch(R, pi, 0, 1)) {
                fprintf(stderr, "sift: error: sweep: full failed on %s: %s (prompt skipped)\n",
                        R->p[pi].id, R->recs[(size_t)pi * w->n_set].note);
                R->done += w->n_set - 1;
                continue;
            }
        }
        for (; at < w->n_set; at += w->parallel) {
            if (cli_interrupted) return 1;
            int end = at + w->parallel < w->n_set ? at + w->parallel : w->n_set;
            if (sw_batch(R, pi, at, end)) {
                fprintf(stderr, "sift: error: sweep: full failed on %s: %s (prompt skipped)\n",
                        R->p[pi].id, R->recs[(size_t)pi * w->n_set].note);
                for (int s = 0; s < w->n_set; s++) R->recs[(size_t)pi * w->n_set + s].state = 0;
                R->done += w->n_set - end;
                break;
            }
        }
    }
    return 0;
}

// ---- prompts ----

// The generated prompts of --tasks: 0, -1 (error printed) or -2 (--n-prompt too small for a task:
// a usage error, printed).
static int sw_task_prompts(sweep_run *R) {
    const sweep_opts *w = R->w;
    eval_haystack hay;
    if (cli_load_haystack(w->haystack, &hay)) return -1;   // its content (flags_done checked the file)
    int rc = 0;
    R->p = xcalloc((size_t)w->n_tasks * w->samples, sizeof *R->p);
    for (int k = 0; k < w->n_tasks && !rc; k++)
        for (int s = 0; s < w->samples && !rc; s++) {
            eval_spec spec = {.task = w->tasks[k], .ctx = w->ctx, .seed = w->seed, .sample = s,
                              .n_samples = w->samples, .chat = tok_chat_kind(R->L->t) != TOK_CHAT_NONE};
            eval_prompt ep;
            char err[512];
            if ((rc = eval_make_prompt(R->L->t, &hay, &spec, &ep, err, sizeof err))) {
                fprintf(stderr, "sift: error: sweep: %s\n", err);
                break;
            }
            sweep_prompt *p = &R->p[R->n_p++];
            char id[64];
            snprintf(id, sizeof id, "%s-%d-%d", eval_task_name(spec.task), spec.ctx, s);
            *p = (sweep_prompt){.id = strdup(id), .ids = ep.ids, .n_ids = ep.n_ids, .n_answers = ep.n_answers};
            memcpy(p->answers, ep.answers, sizeof p->answers);
            ep.ids = NULL;
            eval_prompt_free(&ep);
        }
    eval_haystack_free(&hay);
    return rc;
}

static int sw_user_prompts(sweep_run *R) {
    char err[600];
    run_prompt *rp;
    int n = jobs_read_prompts(&R->w->r, R->L->t, &rp, err, sizeof err);
    if (n < 0) {
        fprintf(stderr, "sift: error: sweep: %s\n", err);
        return -1;
    }
    R->p = xcalloc((size_t)(n ? n : 1), sizeof *R->p);
    for (int i = 0; i < n; i++) {
        R->p[i] = (sweep_prompt){.id = rp[i].id, .ids = rp[i].ids, .n_ids = rp[i].n_ids};
        rp[i].id = NULL, rp[i].ids = NULL;
    }
    R->n_p = n;
    jobs_prompts_free(rp, n);
    if (n == 0) fprintf(stderr, "sift: error: sweep: no prompts in the input\n");
    return n ? 0 : -1;
}

// ---- aggregates and the frontier ----

typedef struct sweep_agg {
    int n, failed;                    // prompts measured (with full), failed runs
    double first, greedy, kl, acc;    // means; acc NaN without answers
    double ttft, tpot, kv_mib, kv_read_mib, rows_pct;
    double x_ttft, x_tpot, x_total;   // full's mean over the setting's over the same prompts
    double fidelity, speedup;         // the chosen axes
    int frontier;
    char label[96];
} sweep_agg;

static double sw_div(double a, double b) { return b > 0 && a > 0 ? a / b : NAN; }

// v as the JSON prints it (4 decimals), read back; NaN stays NaN
static double sw_as_printed(double v) {
    char b[64];
    if (isnan(v)) return v;
    snprintf(b, sizeof b, "%.4f", v);
    return strtod(b, NULL);
}

static void sw_aggregate(const sweep_run *R, sweep_agg *agg) {
    const sweep_opts *w = R->w;
    for (int s = 0; s < w->n_set; s++) {
        sweep_agg *g = &agg[s];
        *g = (sweep_agg){0};
        double ft = 0, fp = 0, tp = 0;
        int n_tp = 0, n_acc = 0;
        for (int pi = 0; pi < R->n_p; pi++) {
            const sweep_rec *r = &R->recs[(size_t)pi * w->n_set + s], *f = &R->recs[(size_t)pi * w->n_set];
            if (r->state < 0) g->failed++;
            if (r->state != 1 || f->state != 1) continue;
            g->n++;
            g->first += r->first_agree, g->greedy += r->greedy, g->kl += r->kl;
            if (!isnan(r->score)) g->acc += r->score, n_acc++;
            g->ttft += r->ttft_ms, ft += f->ttft_ms;
            g->kv_mib += r->kv_bytes / 1048576.0, g->kv_read_mib += r->kv_read / 1048576.0;
            g->rows_pct += r->rows_pct;
            if (!isnan(r->tpot_ms) && !isnan(f->tpot_ms)) tp += r->tpot_ms, fp += f->tpot_ms, n_tp++;
            if (!g->label[0]) memcpy(g->label, r->label, sizeof g->label);
        }
        if (g->n == 0) {
            g->first = g->greedy = g->kl = g->acc = g->ttft = g->tpot = g->kv_mib = NAN;
            g->kv_read_mib = g->rows_pct = g->x_ttft = g->x_tpot = g->x_total = NAN;
            g->fidelity = g->speedup = NAN;
            continue;
        }
        g->first /= g->n, g->greedy /= g->n, g->kl /= g->n, g->ttft /= g->n, ft /= g->n;
        g->kv_mib /= g->n, g->kv_read_mib /= g->n, g->rows_pct /= g->n;
        g->acc = n_acc ? g->acc / n_acc : NAN;
        g->tpot = n_tp ? tp / n_tp : NAN;
        fp = n_tp ? fp / n_tp : NAN;
        g->x_ttft = sw_div(ft, g->ttft);
        g->x_tpot = sw_div(fp, g->tpot);
        double n = w->n_predict;
        g->x_total = sw_div(ft + n * (n_tp ? fp : 0), g->ttft + n * (n_tp ? g->tpot : 0));
        g->fidelity = w->fidelity == SW_FID_GREEDY ? g->greedy : w->fidelity == SW_FID_FIRST ? g->first : g->acc;
        g->speedup = w->speed == SW_SPEED_TOTAL ? g->x_total : w->speed == SW_SPEED_TTFT ? g->x_ttft : g->x_tpot;
    }
    // the frontier of the values as reported (the JSON prints 4 decimals): a setting whose speedup
    // is 1.00004 against full's 1 ties with it in the output, so it does not push full off
    pareto_point pts[SWEEP_MAX_SETTINGS];
    int on[SWEEP_MAX_SETTINGS];
    for (int s = 0; s < w->n_set; s++)
        pts[s] = (pareto_point){sw_as_printed(agg[s].speedup), sw_as_printed(agg[s].fidelity)};
    pareto_frontier(pts, w->n_set, on);
    for (int s = 0; s < w->n_set; s++) agg[s].frontier = on[s];
}

// The fastest setting other than full whose fidelity is at least the --min-agreement; -1: none.
static int sw_best(const sweep_opts *w, const sweep_agg *agg) {
    int best = -1;
    for (int s = 1; s < w->n_set; s++)
        if (agg[s].n && agg[s].fidelity >= w->min_agreement - 1e-12 && !isnan(agg[s].speedup) &&
            (best < 0 || agg[s].speedup > agg[best].speedup))
            best = s;
    return best;
}

// The command line that runs setting s on the same prompts (sift eval's for --tasks).
static void sw_command(const sweep_run *R, int s, char *out, size_t len) {
    const sweep_opts *w = R->w;
    const sweep_setting *x = &w->set[s];
    char q[600], base[512] = "";
    size_t j = 0;
    sw_quote(q, sizeof q, R->L->path);
    // the base flags the strategy reads (each " --flag value")
    for (const char *p = w->base_flags; *p;) {
        const char *next = strstr(p + 1, " --");
        size_t k = next ? (size_t)(next - p) : strlen(p);
        char flag[64];
        snprintf(flag, sizeof flag, "%.*s", (int)strcspn(p + 1, " "), p + 1);
        const opt_def *d = strategy_opt_find(flag);
        if (d && strategy_opt_used_by(d, x->s->name) && !strstr(x->flags, flag))
            snprintf(base + strlen(base), sizeof base - strlen(base), "%.*s", (int)k, p);
        p += k;
    }
    j += (size_t)snprintf(out + j, len - j, "sift%s -m %s --strategy %s%s%s", w->n_tasks ? " eval" : "",
                          q, x->s->name, x->flags, base);
    if (w->threads_given) j += (size_t)snprintf(out + j, len - j, " -t %d", w->threads);
    if (strcmp(w->device, "auto") != 0) j += (size_t)snprintf(out + j, len - j, " --device %s", w->device);
    if (w->weights != BK_WEIGHTS_NATIVE)
        j += (size_t)snprintf(out + j, len - j, " --weights %s", w->weights == BK_WEIGHTS_F32 ? "f32"
                                                                 : w->weights == BK_WEIGHTS_FAST ? "fast" : "exact");
    if (w->n_tasks) {
        j += (size_t)snprintf(out + j, len - j, " --tasks ");
        for (int i = 0; i < w->n_tasks; i++)
            j += (size_t)snprintf(out + j, len - j, "%s%s", i ? "," : "", eval_task_name(w->tasks[i]));
        j += (size_t)snprintf(out + j, len - j, " --n-prompt %d --samples %d --seed %llu", w->ctx, w->samples, w->seed);
        if (w->haystack) sw_quote(q, sizeof q, w->haystack), j += (size_t)snprintf(out + j, len - j, " --haystack %s", q);
        return;
    }
    j += (size_t)snprintf(out + j, len - j, " -n %d --temp 0", w->n_predict);
    if (w->r.system) sw_quote(q, sizeof q, w->r.system), j += (size_t)snprintf(out + j, len - j, " --system %s", q);
    else if (w->r.chat) j += (size_t)snprintf(out + j, len - j, " --chat");
    if (w->batch_dir) sw_quote(q, sizeof q, w->batch_dir), j += (size_t)snprintf(out + j, len - j, " --batch %s", q);
    else
        for (int i = 0; i < w->r.n_files && j + 1 < len; i++)
            sw_quote(q, sizeof q, w->r.files[i]), j += (size_t)snprintf(out + j, len - j, " -f %s", q);
    if (w->r.prompts_path && j + 1 < len)
        sw_quote(q, sizeof q, w->r.prompts_path), j += (size_t)snprintf(out + j, len - j, " --prompts %s", q);
}

// ---- reports ----

static void sw_print_table(FILE *f, const sweep_run *R, const sweep_agg *agg) {
    const sweep_opts *w = R->w;
    fprintf(f, "\n| strategy | settings | prompts | 1st token = full | greedy agree | KL(full‖s) | "
               "accuracy | TTFT ms | TPOT ms | TTFT x | TPOT x | total x | KV MiB | KV read MiB/step | "
               "rows %% of full | frontier |\n"
               "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|\n");
    for (int s = 0; s < w->n_set; s++) {
        const sweep_agg *g = &agg[s];
        const sweep_setting *x = &w->set[s];
        fprintf(f, "| %s | %s%s%s%s | %d", x->s->name, s == 0 ? "reference" : x->grid[0] ? x->grid : "defaults",
                g->label[0] ? " (" : "", g->label, g->label[0] ? ")" : "", g->n);
        if (g->failed) fprintf(f, " (%d failed)", g->failed);
        fputs(" | ", f);
        static const char *const fmt[] = {"%.3f", "%.3f", "%.4f", "%.3f", "%.1f", "%.2f", "%.2f",
                                          "%.2f", "%.2f", "%.2f", "%.3f", "%.1f"};
        double v[] = {g->first, g->greedy, g->kl, g->acc, g->ttft, g->tpot, g->x_ttft, g->x_tpot,
                      g->x_total, g->kv_mib, g->kv_read_mib, g->rows_pct};
        for (int i = 0; i < 12; i++) fputs(i ? " | " : "", f), eval_table_num(f, fmt[i], v[i]);
        fprintf(f, " | %s |\n", g->frontier ? "*" : "");
    }
    fprintf(f, "\n%d prompt%s, -n %d, greedy; fidelity = %s agreement%s, speedup = %s (ratios of means "
               "against full on the same prompts); * = on the Pareto frontier.\n", R->n_p, plural_s(R->n_p),
            w->n_predict,
            SW_FIDELITY[w->fidelity], w->fidelity == SW_FID_ACCURACY ? " (task accuracy)" : " with full",
            w->speed == SW_SPEED_TOTAL ? "end to end (TTFT + n TPOT)" : SW_SPEED[w->speed]);
    if (w->parallel > 1)
        fprintf(f, "--parallel %d: the settings of a prompt decode as batches of %d, full among them: "
                   "TPOT is the batch's step time, shared, not each setting's own.\n", w->parallel, w->parallel);
}

static void sw_json_num(FILE *f, const char *key, const char *fmt, double v) {
    fprintf(f, ",\"%s\":", key);
    if (isnan(v)) fputs("null", f);
    else fprintf(f, fmt, v);
}

static void sw_write_json(FILE *f, const sweep_run *R, const sweep_agg *agg, const char *model_name,
                          int complete, int best) {
    const sweep_opts *w = R->w;
    fprintf(f, "{\"schema\":\"sift-sweep/1\",\"model\":");
    tok_json_str(f, model_name, strlen(model_name));
    fprintf(f, ",\"device\":\"%s\",\"n_predict\":%d,\"parallel\":%d,\"tpot_shared\":%s,"
               "\"fidelity\":\"%s\",\"speed\":\"%s\",\"complete\":%s,\"prompts\":[",
            R->L->bk->name, w->n_predict, w->parallel, w->parallel > 1 ? "true" : "false",
            SW_FIDELITY[w->fidelity], SW_SPEED[w->speed], complete ? "true" : "false");
    for (int i = 0; i < R->n_p; i++) {
        fprintf(f, "%s{\"id\":", i ? "," : "");
        tok_json_str(f, R->p[i].id, strlen(R->p[i].id));
        fprintf(f, ",\"tokens\":%d,\"answers\":[", R->p[i].n_ids);
        for (int k = 0; k < R->p[i].n_answers; k++) {
            fputs(k ? "," : "", f);
            tok_json_str(f, R->p[i].answers[k], strlen(R->p[i].answers[k]));
        }
        fputs("]}", f);
    }
    fputs("],\"settings\":[", f);
    for (int s = 0; s < w->n_set; s++) {
        const sweep_setting *x = &w->set[s];
        const sweep_agg *g = &agg[s];
        fprintf(f, "%s{\"index\":%d,\"strategy\":\"%s\",\"grid\":", s ? "," : "", s, x->s->name);
        tok_json_str(f, x->grid, strlen(x->grid));
        fputs(",\"params\":", f);
        strategy_opts so = strategy_opts_resolved(x->s, R->L->m, &x->run, &x->so);   // as they ran
        strategy_settings_json(f, &so, x->s->name);
        fputs(",\"label\":", f);
        tok_json_str(f, g->label, strlen(g->label));
        fprintf(f, ",\"prompts\":%d,\"failed\":%d", g->n, g->failed);
        sw_json_num(f, "first_token_agree", "%.4f", g->first);
        sw_json_num(f, "greedy_agree", "%.4f", g->greedy);
        sw_json_num(f, "kl", "%.6f", g->kl);
        sw_json_num(f, "accuracy", "%.4f", g->acc);
        sw_json_num(f, "ttft_ms", "%.3f", g->ttft);
        sw_json_num(f, "tpot_ms", "%.4f", g->tpot);
        sw_json_num(f, "speedup_ttft", "%.4f", g->x_ttft);
        sw_json_num(f, "speedup_tpot", "%.4f", g->x_tpot);
        sw_json_num(f, "speedup_total", "%.4f", g->x_total);
        sw_json_num(f, "kv_mib", "%.4f", g->kv_mib);
        sw_json_num(f, "kv_read_mib_per_step", "%.4f", g->kv_read_mib);
        sw_json_num(f, "rows_pct_of_full", "%.3f", g->rows_pct);
        sw_json_num(f, "fidelity", "%.4f", g->fidelity);
        sw_json_num(f, "speedup", "%.4f", g->speedup);
        fprintf(f, ",\"frontier\":%s}", g->frontier ? "true" : "false");
    }
    fputs("],\"records\":[", f);
    int first = 1;
    for (int pi = 0; pi < R->n_p; pi++)
        for (int s = 0; s < w->n_set; s++) {
            const sweep_rec *r = &R->recs[(size_t)pi * w->n_set + s];
            if (r->state == 0) continue;
            fprintf(f, "%s{\"prompt\":%d,\"setting\":%d,\"ok\":%s", first ? "" : ",", pi, s,
                    r->state > 0 ? "true" : "false");
            first = 0;
            if (r->state > 0) {
                fprintf(f, ",\"first_token_agree\":%s", r->first_agree ? "true" : "false");
                sw_json_num(f, "greedy_agree", "%.4f", r->greedy);
                sw_json_num(f, "kl", "%.6f", r->kl);
                sw_json_num(f, "accuracy", "%.4f", r->score);
                sw_json_num(f, "ttft_ms", "%.3f", r->ttft_ms);
                sw_json_num(f, "tpot_ms", "%.4f", r->tpot_ms);
                fprintf(f, ",\"kv_bytes\":%.0f,\"kv_read_per_step\":%.0f,\"rows_pct_of_full\":%.3f,"
                           "\"generated\":%d", r->kv_bytes, r->kv_read, r->rows_pct, r->n_gen);
            }
            fputs(",\"note\":", f);
            tok_json_str(f, r->note, strlen(r->note));
            fputs("}", f);
        }
    fputs("],\"frontier\":[", f);
    first = 1;
    for (int s = 0; s < w->n_set; s++)
        if (agg[s].frontier) fprintf(f, "%s%d", first ? "" : ",", s), first = 0;
    fputs("],\"best\":", f);
    if (w->min_agreement < 0) fputs("null", f);
    else {
        fprintf(f, "{\"min_agreement\":%g,\"setting\":", w->min_agreement);
        // no setting qualifies: "setting" null, the command runs full (setting 0) on the prompts
        char cmd[4096];
        sw_command(R, best < 0 ? 0 : best, cmd, sizeof cmd);
        if (best < 0) fputs("null,\"command\":", f);
        else fprintf(f, "%d,\"command\":", best);
        tok_json_str(f, cmd, strlen(cmd));
        fputs("}", f);
    }
    fputs("}\n", f);
}

static void sw_write_csv(FILE *f, const sweep_run *R, const sweep_agg *agg) {
    const sweep_opts *w = R->w;
    fprintf(f, "index,strategy,grid,prompts,failed,first_token_agree,greedy_agree,kl,accuracy,ttft_ms,"
               "tpot_ms,speedup_ttft,speedup_tpot,speedup_total,kv_mib,kv_read_mib_per_step,"
               "rows_pct_of_full,frontier\n");
    for (int s = 0; s < w->n_set; s++) {
        const sweep_agg *g = &agg[s];
        fprintf(f, "%d,%s,\"%s\",%d,%d", s, w->set[s].s->name, w->set[s].grid, g->n, g->failed);
        double v[] = {g->first, g->greedy, g->kl, g->acc, g->ttft, g->tpot, g->x_ttft, g->x_tpot,
                      g->x_total, g->kv_mib, g->kv_read_mib, g->rows_pct};
        for (int i = 0; i < (int)(sizeof v / sizeof *v); i++)
            if (isnan(v[i])) fputs(",", f);
            else fprintf(f, ",%.6g", v[i]);
        fprintf(f, ",%d\n", g->frontier);
    }
}

static void sw_write_svg(FILE *f, const sweep_run *R, const sweep_agg *agg) {
    const sweep_opts *w = R->w;
    pareto_point pts[SWEEP_MAX_SETTINGS];
    int on[SWEEP_MAX_SETTINGS], group[SWEEP_MAX_SETTINGS];
    char labels[SWEEP_MAX_SETTINGS][300];
    const char *lp[SWEEP_MAX_SETTINGS];
    for (int s = 0; s < w->n_set; s++) {
        pts[s] = (pareto_point){agg[s].speedup, agg[s].fidelity};
        on[s] = agg[s].frontier;
        group[s] = 0;
        for (int k = 0; k < s && !group[s]; k++)
            if (w->set[k].s == w->set[s].s) group[s] = group[k];
        if (s && !group[s]) {
            int g = 0;
            for (int k = 0; k < s; k++) g = group[k] > g ? group[k] : g;
            group[s] = g + 1;
        }
        snprintf(labels[s], sizeof labels[s], "%s%s%s", w->set[s].s->name, w->set[s].grid[0] ? " " : "", w->set[s].grid);
        lp[s] = labels[s];
    }
    char x_label[80], y_label[80];
    snprintf(x_label, sizeof x_label, "speedup over full (%s)", w->speed == SW_SPEED_TOTAL ? "end to end" : SW_SPEED[w->speed]);
    snprintf(y_label, sizeof y_label, "%s%s", SW_FIDELITY[w->fidelity],
             w->fidelity == SW_FID_ACCURACY ? " (task accuracy)" : " agreement with full");
    eval_write_scatter_svg(f, x_label, y_label, pts, lp, group, on, w->n_set);
}

typedef struct {
    const sweep_run *R;
    const sweep_agg *agg;
    const char *model_name;
    int complete, best;
} sw_report_ctx;

static void sw_write_file(FILE *f, int i, const void *ctx) {
    const sw_report_ctx *c = ctx;
    if (i == 0) sw_write_json(f, c->R, c->agg, c->model_name, c->complete, c->best);
    else if (i == 1) sw_write_csv(f, c->R, c->agg);
    else sw_write_svg(f, c->R, c->agg);
}

static const char *const SW_OUT_FLAGS[3] = {"-o", "--csv", "--plot"};

static int sw_report(const sweep_run *R, const char *model_name, int complete) {
    const sweep_opts *w = R->w;
    sweep_agg agg[SWEEP_MAX_SETTINGS];
    sw_aggregate(R, agg);
    if (!complete)
        fprintf(stderr, "sift: sweep interrupted: reporting the %d run%s measured\n", R->done, plural_s(R->done));
    sw_print_table(stdout, R, agg);
    int best = w->min_agreement >= 0 ? sw_best(w, agg) : -1;
    if (w->min_agreement >= 0) {
        if (best < 0) {
            char cmd[4096];
            sw_command(R, 0, cmd, sizeof cmd);
            printf("\nno setting keeps %s agreement >= %g on these prompts: run full:\n%s\n",
                   SW_FIDELITY[w->fidelity], w->min_agreement, cmd);
        } else {
            char cmd[4096];
            sw_command(R, best, cmd, sizeof cmd);
            printf("\nfastest setting with %s agreement >= %g: %s %s (%s %.3f, %.2fx %s):\n%s\n",
                   SW_FIDELITY[w->fidelity], w->min_agreement, w->set[best].s->name,
                   w->set[best].grid[0] ? w->set[best].grid : "(defaults)", SW_FIDELITY[w->fidelity],
                   agg[best].fidelity, agg[best].speedup, SW_SPEED[w->speed], cmd);
        }
    }
    fflush(stdout);
    sw_report_ctx c = {R, agg, model_name, complete, best};
    return cli_write_outputs((const char *[]){w->json_path, w->csv_path, w->plot_path}, SW_OUT_FLAGS,
                             3, sw_write_file, &c);
}

// The settings' run context on the loaded model (draft, end-of-generation test), each
// setting's options checked by its strategy. 0, or 2 (error printed).
static int sw_bind(sweep_opts *w, const model *m, const strategy_run *loaded) {
    for (int s = 0; s < w->n_set; s++) {
        strategy_opts *o = &w->set[s].so;
        w->set[s].run = *loaded;
        if (!o->draft_path) w->set[s].run.draft = NULL;
        char err[512];
        if (strategy_check(w->set[s].s, m, o, err, sizeof err)) {
            fprintf(stderr, "sift: error: sweep: %s %s: %s\n", w->set[s].s->name, w->set[s].grid, err);
            return 2;
        }
    }
    return 0;
}

int cmd_sweep(int argc, char **argv) {
    sweep_opts w;
    sweep_parse(argc, argv, &w);
    if (cli_refuse_synthetic(w.model, "sweep")) return 2;
    const char *outs[3] = {w.json_path, w.csv_path, w.plot_path};
    if (cli_check_outputs(outs, SW_OUT_FLAGS, 3)) return 2;
    loaded L;
    cli_hw hw = {w.device, w.threads, w.weights, w.ctx_size, GGML_F32, w.cache_k, w.cache_v, w.ubatch};
    strategy_run run = {0};
    sweep_run R = {.w = &w};
    int rc = cli_load(&L, w.model, w.draft_path, &hw, &w.set[0].s, 1, &w.so, &run);
    if (rc == 0 && !w.grid) sw_default_grid(&w, L.m->cfg.n_layer);
    if (rc == 0 && w.n_set == 1) {
        fprintf(stderr, "sift: error: sweep: no setting to compare with full\n");
        rc = 2;
    }
    if (rc == 0) rc = sw_bind(&w, L.m, &run);
    if (rc == 0) {
        R.L = &L;
        int made = w.n_tasks ? sw_task_prompts(&R) : sw_user_prompts(&R);
        rc = made == -2 ? 2 : made ? 1 : 0;   // -2: --n-prompt too small for a task (usage)
    }
    int limit = rc ? 0 : w.ctx_size > 0 ? w.ctx_size : L.m->cfg.ctx_len;
    for (int i = 0; i < R.n_p && rc == 0; i++)
        if ((long)R.p[i].n_ids + w.n_predict > limit) {
            fprintf(stderr, "sift: error: sweep: prompt '%s' has %d token%s; with -n %d that exceeds "
                            "the %s %d (%s)\n", R.p[i].id, R.p[i].n_ids, plural_s(R.p[i].n_ids),
                    w.n_predict, w.ctx_size > 0 ? "context size -c" : "model's context",
                    limit, w.n_tasks ? "a smaller --n-prompt or -n" : "a smaller -n");
            rc = 2;
        }
    if (rc == 0) {
        if (!w.quiet)
            fprintf(stderr, "sift: sweep: %d prompt%s x %d settings (full included), -n %d, greedy%s\n",
                    R.n_p, plural_s(R.n_p), w.n_set, w.n_predict, w.parallel > 1 ? ", batches of --parallel" : "");
        R.recs = xcalloc((size_t)R.n_p * w.n_set, sizeof *R.recs);
        R.logits = xmalloc((size_t)(w.parallel + 1) * L.m->cfg.vocab * sizeof(float));
        signal(SIGINT, cli_on_sigint);
        int run = sw_run_all(&R);
        signal(SIGINT, SIG_DFL);
        int written = sw_report(&R, L.m->name ? L.m->name : cli_base_name(L.path), run != 1);
        rc = written ? 1 : run == 1 ? 130 : R.failed ? 1 : 0;
    }
    for (int i = 0; i < R.n_p; i++) free(R.p[i].id), free(R.p[i].ids);
    free(R.p);
    free(R.recs);
    free(R.logits);
    tok_answer_free(&R.full);
    cli_unload(&L);
    sweep_free(&w);
    return rc;
}
