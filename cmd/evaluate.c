// cmd/evaluate.c — `sift eval`: for every context x task x sample, build the task's prompt, run every
// chosen strategy (and `full`, the reference, first) greedily on the same tokens, score the answer
// and measure the fidelity to full; then print the tables and write JSON / CSV / SVG.
// Ctrl-C stops between prompts and reports what was measured (exit 130).
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../eval/eval.h"
#include "../util/check.h"
#include "cmd.h"
#include "flags.h"

#define MAX_CTXS 16

typedef struct {
    const char *model, *haystack, *json_path, *csv_path, *plot_path, *draft_path, *device;
    enum bk_weights weights;   // --weights native|fast|exact|f32 (CPU)
    const char *cache_k, *cache_v;   // --cache-type-k/-v (kvrow.h names; "auto": cli_kv_default)
    int ubatch;                      // --ubatch: rows of one prefill pass (0: one pass)
    const strategy *strategies[MAX_STRATEGIES];
    int n_strategies;
    int tasks[EVAL_N_TASKS], n_tasks;
    int ctxs[MAX_CTXS], n_ctxs;
    int samples, threads, dump, quiet, ctx;   // ctx: -c (0: the model's)
    int query_agnostic;   // --query-agnostic: a prefill strategy compresses the context alone
    unsigned long long seed;
    strategy_opts so;
    strategy_run run;          // the draft and end-of-generation test (cli_load)
} eval_opts;

// `full` is the reference every fidelity number needs: make it run first.
static void full_first(eval_opts *e) {
    const strategy *full = strategy_find("full");
    int at = -1;
    for (int i = 0; i < e->n_strategies; i++)
        if (e->strategies[i] == full) at = i;
    if (at < 0 && e->n_strategies == MAX_STRATEGIES) cli_usage_error("more than %d strategies", MAX_STRATEGIES - 1);
    if (at < 0) at = e->n_strategies++;
    for (int i = at; i > 0; i--) e->strategies[i] = e->strategies[i - 1];
    e->strategies[0] = full;
}

static void eval_parse(int argc, char **argv, eval_opts *e) {
    flag_set f;
    flags_parse(&f, SUB_EVAL, argc, argv, 2);
    const flag_val *v = f.v;
    *e = (eval_opts){.model = v[FL_MODEL].s, .device = cli_device(v[FL_DEVICE].s),
                     .weights = cli_weights(v[FL_WEIGHTS].s), .cache_k = v[FL_CACHE_TYPE_K].s,
                      .cache_v = v[FL_CACHE_TYPE_V].s, .ubatch = (int)v[FL_UBATCH].i, .samples = (int)v[FL_SAMPLES].i,
                     .seed = (unsigned long long)v[FL_SEED].i, .haystack = v[FL_HAYSTACK].s,
                     .json_path = v[FL_OUTPUT].s, .csv_path = v[FL_CSV].s, .plot_path = v[FL_PLOT].s,
                     .threads = (int)v[FL_THREADS].i, .ctx = (int)v[FL_CTX].i,
                     .dump = v[FL_DUMP].given > 0, .query_agnostic = v[FL_QUERY_AGNOSTIC].given > 0, .quiet = flag_verbosity == 0, .so = f.so,
                     .draft_path = f.so.draft_path, .n_ctxs = v[FL_N_PROMPT].n};
    memcpy(e->ctxs, v[FL_N_PROMPT].list, sizeof e->ctxs);
    for (int i = 0; i < e->n_ctxs; i++)
        if (e->ctxs[i] < 64) cli_usage_error("--n-prompt %d: eval's prompts are at least 64 tokens", e->ctxs[i]);
    if (v[FL_SEED].i < 0) cli_usage_error("--seed -1 (random) is sift run's; eval's prompts come from a fixed seed");
    e->n_tasks = cli_tasks(v[FL_TASKS].s, e->tasks);
    e->n_strategies = cli_strategies(v[FL_STRATEGY].s, e->strategies);
    flags_check_strategy_params(&f, e->strategies, e->n_strategies);
    if (e->plot_path && !cli_ends_with(e->plot_path, ".svg"))
        cli_usage_error("--plot %s: only SVG is written (name the file .svg; convert it to PNG "
                        "with e.g. rsvg-convert)", e->plot_path);
    if (e->draft_path && e->so.draft_layers)
        cli_usage_error("--draft and --draft-layers exclude each other");
    if (e->threads == 0) e->threads = backend_cpu_default_threads(NULL);
    full_first(e);
    flags_done(&f);
}

// ---- one strategy on one prompt ----

typedef struct {
    const eval_opts *e;
    loaded *L;
    eval_haystack hay;
    eval_record *recs;
    int n_recs;
    float *full_logits, *logits;
    tok_answer full_answer;
} eval_run;

// Runs strategy s on prompt p; fills rec (fidelity against the full run of the same prompt,
// which comes first). 0 or -1 (error printed).
static int run_one(eval_run *R, const strategy *s, const eval_spec *spec, const eval_prompt *p,
                   eval_record *rec) {
    model *m = R->L->m;
    int is_full = strcmp(s->name, "full") == 0;
    tok_answer a = {.t = R->L->t};
    sampler smp;
    sampler_init(&smp, &(sample_params){.temp = 0}, m->cfg.vocab);
    run_stats st;
    char err[512];
    // --query-agnostic: a prefill strategy that compresses (its prefill part's) compresses the
    // context alone, as a shared prefix of a batch job is (compress once, ask many), and the
    // question is prefilled after it; the other strategies run as they do by default
    const strategy *pre = s->prefill_part ? s->prefill_part : s;
    strategy_run run = R->e->run;
    kv_prefix *pf = NULL;
    if (R->e->query_agnostic && pre->compresses_prefix && p->n_context > 0 && p->n_context < p->n_ids &&
        !(pf = prefix_build_with(R->L->cx, pre, &R->e->so, &R->e->run, p->ids, p->n_context, err, sizeof err))) {
        fprintf(stderr, "sift: error: eval: %s on %s at ctx %d, sample %d: %s\n", s->name,
                eval_task_name(spec->task), spec->ctx, spec->sample, err);
        sampler_free(&smp);
        return -1;
    }
    run.prefix = pf;
    int rc = run_generate(s, R->L->cx, &R->e->so, &run, p->ids, p->n_ids, eval_task_n_gen(spec->task),
                          &smp, tok_answer_token, &a, &st, is_full ? R->full_logits : R->logits,
                          err, sizeof err);
    double pf_ms = pf ? pf->ms : 0;
    prefix_free(pf);
    sampler_free(&smp);
    if (rc) {
        fprintf(stderr, "sift: error: eval: %s on %s at ctx %d, sample %d: %s\n", s->name,
                eval_task_name(spec->task), spec->ctx, spec->sample, err);
        tok_answer_free(&a);
        return -1;
    }
    *rec = (eval_record){.strategy = s->name, .task = spec->task, .ctx = spec->ctx,
                         .sample = spec->sample, .seed = spec->seed, .depth = p->depth,
                         .prompt_tokens = p->n_ids, .answer = a.text ? a.text : strdup(""),
                         // a compressed context's one compression counted in (as for one question)
                         .ttft_ms = st.prompt_ms + pf_ms, .kv_mib = st.kv_bytes / 1048576.0,
                         .tpot_ms = per_token(st.decode_runs, st.decode_ms)};
    memcpy(rec->note, st.note, sizeof rec->note - 1);   // truncated, always terminated
    rec->note[sizeof rec->note - 1] = 0;
    for (int i = 0; i < p->n_answers; i++) {
        strcat(rec->expected, i ? "|" : "");
        strcat(rec->expected, p->answers[i]);
    }
    rec->score = eval_score(p->answers, p->n_answers, rec->answer);
    if (is_full) {
        free(R->full_answer.ids);
        R->full_answer = a;
    }
    const tok_answer *f = &R->full_answer;
    rec->greedy_agree = tok_agreement(f->ids, f->n_ids, a.ids, a.n_ids, &rec->first_agree);
    rec->kl = is_full ? 0 : eval_kl(R->full_logits, R->logits, m->cfg.vocab);
    if (!is_full) free(a.ids);
    return 0;
}

// ---- progress ----

static void eval_progress(const eval_opts *e, int done, int total, double t0, const eval_spec *spec,
                     const eval_record *recs, int n_recs) {
    if (e->quiet) return;
    if (isatty(2)) {
        double left = done ? (now_ms() - t0) / done * (total - done) / 1000 : 0;
        int bar = 30 * done / total;
        fprintf(stderr, "\reval [%.*s%.*s] %d/%d prompts, ETA %dm%02ds   ", bar,
                "##############################", 30 - bar, "..............................", done,
                total, (int)left / 60, (int)left % 60);
        if (done == total) fprintf(stderr, "\n");
        return;
    }
    if (spec->sample + 1 < e->samples) return;   // a plain line when a cell is complete
    for (int k = 0; k < e->n_strategies; k++) {
        double acc = 0, kl = 0, ttft = 0;
        int n = 0;
        for (int i = 0; i < n_recs; i++)
            if (recs[i].ctx == spec->ctx && recs[i].task == spec->task &&
                recs[i].strategy == e->strategies[k]->name) {
                acc += recs[i].score, kl += recs[i].kl, ttft += recs[i].ttft_ms;
                n++;
            }
        if (n)
            fprintf(stderr, "eval: ctx %d %s %s: accuracy %.2f, KL %.4f, TTFT %.0f ms (%d/%d prompts)\n",
                    spec->ctx, eval_task_name(spec->task), e->strategies[k]->name, acc / n, kl / n,
                    ttft / n, done, total);
    }
}

static void dump_prompt(const eval_spec *spec, const eval_prompt *p) {
    printf("{\"task\":\"%s\",\"ctx\":%d,\"sample\":%d,\"seed\":%llu,\"depth\":%.4f,"
           "\"prompt_tokens\":%d,\"n_gen\":%d,\"answers\":[",
           eval_task_name(spec->task), spec->ctx, spec->sample, (unsigned long long)spec->seed,
           p->depth, p->n_ids, eval_task_n_gen(spec->task));
    for (int i = 0; i < p->n_answers; i++) {
        printf(i ? "," : "");
        tok_json_str(stdout, p->answers[i], strlen(p->answers[i]));
    }
    printf("],\"text\":");
    tok_json_str(stdout, p->text, strlen(p->text));
    printf("}\n");
}

// Every prompt in order; stops early on Ctrl-C or an error. 0, -1 (error), -2 (--n-prompt too small
// for a task: a usage error) or 1 (interrupted).
static int eval_run_all(eval_run *R) {
    const eval_opts *e = R->e;
    int total = e->n_ctxs * e->n_tasks * e->samples, done = 0;
    double t0 = now_ms();
    for (int c = 0; c < e->n_ctxs; c++)
        for (int k = 0; k < e->n_tasks; k++)
            for (int s = 0; s < e->samples; s++) {
                if (cli_interrupted) return 1;
                eval_spec spec = {.task = e->tasks[k], .ctx = e->ctxs[c], .seed = e->seed,
                                  .sample = s, .n_samples = e->samples,
                                  .chat = tok_chat_kind(R->L->t) != TOK_CHAT_NONE};
                eval_prompt p;
                char err[512];
                int made = eval_make_prompt(R->L->t, &R->hay, &spec, &p, err, sizeof err);
                if (made) {
                    fprintf(stderr, "sift: error: eval: %s\n", err);
                    return made;
                }
                if (e->dump) dump_prompt(&spec, &p);
                for (int i = 0; i < e->n_strategies && !e->dump; i++) {
                    R->recs = xrealloc(R->recs, (size_t)(R->n_recs + 1) * sizeof *R->recs);
                    if (run_one(R, e->strategies[i], &spec, &p, &R->recs[R->n_recs])) {
                        for (; i > 0; i--) free(R->recs[--R->n_recs].answer);   // whole prompts only
                        eval_prompt_free(&p);
                        return -1;
                    }
                    R->n_recs++;
                }
                eval_prompt_free(&p);
                if (!e->dump) eval_progress(e, ++done, total, t0, &spec, R->recs, R->n_recs);
            }
    return 0;
}

// ---- reports ----

static void write_file(FILE *f, int i, const void *rep) {
    if (i == 0) eval_write_json(f, rep);
    else if (i == 1) eval_write_csv(f, rep);
    else eval_write_svg(f, rep);
}

static const char *const OUT_FLAGS[3] = {"-o", "--csv", "--plot"};

static int write_reports(const eval_opts *e, const eval_report *rep) {
    return cli_write_outputs((const char *[]){e->json_path, e->csv_path, e->plot_path}, OUT_FLAGS,
                             3, write_file, rep);
}

// The tables on stdout and the files asked for; 0 or -1 (a file could not be written).
static int write_report(const eval_opts *e, const eval_run *R, const char *model_name, int complete) {
    const char *names[MAX_STRATEGIES];
    for (int i = 0; i < e->n_strategies; i++) names[i] = e->strategies[i]->name;
    eval_report rep = {.model = model_name, .seed = e->seed, .samples = e->samples, .query_agnostic = e->query_agnostic,
                       .strategies = names, .n_strategies = e->n_strategies, .tasks = e->tasks,
                       .n_tasks = e->n_tasks, .ctxs = e->ctxs, .n_ctxs = e->n_ctxs,
                       .recs = R->recs, .n_recs = R->n_recs, .complete = complete};
    if (!complete)
        fprintf(stderr, "sift: eval interrupted: reporting the %d prompt%s measured\n",
                R->n_recs / e->n_strategies, plural_s(R->n_recs / e->n_strategies));
    eval_print_tables(stdout, &rep);
    return write_reports(e, &rep);
}

int cmd_eval(int argc, char **argv) {
    eval_opts e;
    eval_parse(argc, argv, &e);
    if (cli_refuse_synthetic(e.model, "eval")) return 2;
    if (cli_check_outputs((const char *[]){e.json_path, e.csv_path, e.plot_path}, OUT_FLAGS, 3))
        return 2;
    eval_run R = {.e = &e};
    if (cli_load_haystack(e.haystack, &R.hay)) return 1;   // its content (flags_done checked the file)
    loaded L;
    cli_hw hw = {e.device, e.threads, e.weights, e.ctx, GGML_F32, e.cache_k, e.cache_v, e.ubatch};
    int rc = cli_load(&L, e.model, e.draft_path, &hw, e.strategies, e.n_strategies,
                      &e.so, &e.run);
    int limit = rc ? 0 : e.ctx > 0 ? e.ctx : L.m->cfg.ctx_len;
    for (int i = 0; i < e.n_ctxs && rc == 0; i++)
        if (e.ctxs[i] > limit) {
            fprintf(stderr, "sift: error: --n-prompt %d is beyond the %s %d\n", e.ctxs[i],
                    e.ctx > 0 ? "context size -c" : "model's context", limit);
            rc = 2;
        }
    if (rc == 0) {
        R.L = &L;
        R.full_logits = xmalloc((size_t)L.m->cfg.vocab * sizeof(float));
        R.logits = xmalloc((size_t)L.m->cfg.vocab * sizeof(float));
        signal(SIGINT, cli_on_sigint);
        int run = eval_run_all(&R);
        signal(SIGINT, SIG_DFL);
        // a run that failed has said why; no tables of what it did not measure follow its error
        int written = e.dump || run < 0 ? 0 : write_report(&e, &R, L.m->name ? L.m->name : cli_base_name(L.path), run != 1);
        rc = run == -2 ? 2 : run < 0 || written ? 1 : run == 1 ? 130 : 0;
    }
    for (int i = 0; i < R.n_recs; i++) free(R.recs[i].answer);
    free(R.recs);
    free(R.full_logits);
    free(R.logits);
    free(R.full_answer.ids);
    eval_haystack_free(&R.hay);
    cli_unload(&L);
    return rc;
}
