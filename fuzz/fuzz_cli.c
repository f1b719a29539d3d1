// fuzz/fuzz_cli.c — libFuzzer target: the one flag table's parser (cmd/flags.c) as `sift`, `sift bench`,
// `sift eval`, `sift sweep` (its --grid included), `sift ppl` and `sift fit-phi` read it, on arbitrary argument lists (the input split at NUL bytes, at most
// 32 arguments). A parser either returns options inside their documented ranges or ends the process with exit code 2 (usage
// error) or 0 (--help, --version). Here exit() is renamed (this translation unit only) to a
// longjmp back into the harness, so every path through the parsers can be explored; no model is
// loaded and no prompt file is read. Run with -close_fd_mask=3 (help and usage text are noise).
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static jmp_buf fuzz_back;
static int fuzz_code;
static void fuzz_exit(int code) __attribute__((noreturn));

#define exit fuzz_exit
#include "../cmd/bench.c"
#include "../cmd/cli.c"
#include "../cmd/evaluate.c"
#include "../cmd/ppl.c"
#include "../cmd/fit_phi.c"
#include "../cmd/flags.c"
#include "../cmd/run.c"
#include "../cmd/sweep.c"
#undef exit

static void fuzz_exit(int code) {
    fuzz_code = code;
    longjmp(fuzz_back, 1);
}

#define FUZZ_MAX_ARGS 32

// The options cmd_run would run with are inside the ranges the help documents.
static void check_options(const options *o) {
    const run_opts *r = &o->r;
    if (r->n_strategies < 1 || r->n_strategies > MAX_STRATEGIES) abort();
    for (int i = 0; i < r->n_strategies; i++)
        if (!r->strategies[i]) abort();
    if (r->n_predict == 0 || r->n_predict < -1) abort();
    if (r->threads < 1 || r->so != &o->so || r->run != &o->run) abort();
    if (!r->prompt && r->n_files == 0 && !r->prompts_path) abort();
    if (r->parallel < 1 || r->parallel > FWD_MAX_BATCH) abort();
    if (r->shard_n < 0 || (r->shard_n > 0 && (r->shard_k < 0 || r->shard_k >= r->shard_n))) abort();
    if (r->resume && !r->output) abort();
    if (r->format != RUN_FORMAT_AUTO && r->format != RUN_FORMAT_SIFT && r->format != RUN_FORMAT_OPENAI) abort();
    if (r->format == RUN_FORMAT_OPENAI && (r->n_strategies != 1 || !r->json)) abort();
    if (!r->kept_map != !o->run.count_selected) abort();
    if (r->sp.top_p <= 0 || r->sp.top_p > 1 || r->sp.temp < 0) abort();
    if (o->so.kv_rate < 0 || o->so.kv_rate > 1 || o->so.keep < 0 || o->so.keep > 1) abort();
    if (o->so.pool_kernel % 2 == 0 || o->so.spec_pool % 2 == 0) abort();
    if (o->so.pool < 0 || o->so.pool > 1 || o->so.kv_len < 0 || o->so.tsp_len < 0) abort();
    if (o->so.keep_last != 0 && o->so.keep_last != 1) abort();
}

// A sweep's settings: full first, then strategies that read every parameter the grid set, each
// value inside its range.
static void check_sweep(const sweep_opts *w) {
    if (w->n_set < 1 || w->n_set > SWEEP_MAX_SETTINGS || w->set[0].s != strategy_find("full")) abort();
    if (w->n_predict < 1 || w->parallel < 1 || w->parallel > FWD_MAX_BATCH || w->threads < 1) abort();
    if (w->min_agreement != -1 && (w->min_agreement < 0 || w->min_agreement > 1)) abort();
    int user = w->r.n_files > 0 || w->r.prompts_path;
    if (user == (w->n_tasks > 0) || (w->grid && w->only)) abort();
    if (w->fidelity == SW_FID_ACCURACY && !w->n_tasks) abort();
    for (int i = 1; i < w->n_set; i++) {
        const sweep_setting *x = &w->set[i];
        if (!x->s || x->s == w->set[0].s) abort();
        if (x->so.kv_rate <= 0 || x->so.kv_rate > 1 || x->so.keep <= 0 || x->so.keep > 1) abort();
        if (x->so.budget <= 0 || x->so.budget > 1 || x->so.tsp_rate <= 0 || x->so.tsp_rate > 1) abort();
        if (x->so.pool_kernel % 2 == 0 || x->so.spec_pool % 2 == 0) abort();
        if (x->so.draft_path && (!w->draft_path || strcmp(x->so.draft_path, w->draft_path))) abort();
        for (int k = 1; k < i; k++)
            if (w->set[k].s == x->s && strcmp(w->set[k].grid, x->grid) == 0) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1), *argv[FUZZ_MAX_ARGS + 2] = {"sift"};
    memcpy(buf, data, size);
    buf[size] = 0;
    int argc = 1;
    for (size_t i = 0; i <= size && argc <= FUZZ_MAX_ARGS; i += strlen(buf + i) + 1) argv[argc++] = buf + i;
    argv[argc] = NULL;
    static options o;   // static: the longjmp must not lose what the parser allocated
    memset(&o, 0, sizeof o);
    if (setjmp(fuzz_back) == 0) {
        if (argc > 1 && strcmp(argv[1], "bench") == 0) {
            bench_opts b;
            bench_parse(argc, argv, &b);
            if (b.n_strategies < 1 || b.reps < 1 || b.n_gen < 1) abort();
        } else if (argc > 1 && strcmp(argv[1], "eval") == 0) {
            eval_opts e;
            eval_parse(argc, argv, &e);
            if (e.n_strategies < 1 || e.n_tasks < 1 || e.n_ctxs < 1 || e.samples < 1) abort();
        } else if (argc > 1 && strcmp(argv[1], "sweep") == 0) {
            static sweep_opts w;   // static: as o; what the last input allocated is freed here
            sweep_free(&w);
            sweep_parse(argc, argv, &w);
            check_sweep(&w);
        } else if (argc > 1 && strcmp(argv[1], "fit-phi") == 0) {
            fit_opts f;
            fit_parse(argc, argv, &f);
            if (!f.data || !f.out || f.ctx < 1 || f.steps < 1) abort();
        } else if (argc > 1 && strcmp(argv[1], "ppl") == 0) {
            ppl_opts p;
            ppl_parse(argc, argv, &p);
            if (!p.file || p.ctx < 2 || !p.s) abort();
        } else {
            parse_args(argc, argv, &o);
            check_options(&o);
        }
    } else if (fuzz_code != 2 && fuzz_code != 0) {
        abort();
    }
    for (int i = 0; i < o.r.n_files; i++) free(o.r.files[i]);
    free(o.r.files);
    free(buf);
    return 0;
}
