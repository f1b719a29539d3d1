// fuzz/fuzz_cli.c — libFuzzer target: the command-line parsers of `sift`, `sift bench`, `sift eval`,
// `sift ppl` and `sift fit-phi` on arbitrary argument lists (the input split at NUL bytes, at most
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
#define main sift_main
#include "../cmd/bench.c"
#include "../cmd/cli.c"
#include "../cmd/eval.c"
#include "../cmd/ppl.c"
#include "../cmd/fit_phi.c"
#include "../cmd/run.c"
#include "../main.c"
#undef main
#undef exit

static void fuzz_exit(int code) {
    fuzz_code = code;
    longjmp(fuzz_back, 1);
}

#define FUZZ_MAX_ARGS 32

// The options main() would run with are inside the ranges the help documents.
static void check_options(const options *o) {
    const run_opts *r = &o->r;
    if (r->n_strategies < 1 || r->n_strategies > MAX_STRATEGIES) abort();
    for (int i = 0; i < r->n_strategies; i++)
        if (!r->strategies[i]) abort();
    if (r->n_predict == 0 || r->n_predict < -1) abort();
    if (r->threads < 1 || o->so.n_threads != r->threads || r->so != &o->so) abort();
    if (!r->prompt && r->n_files == 0 && !r->prompts_path) abort();
    if (r->parallel < 1 || r->parallel > FWD_MAX_BATCH) abort();
    if (r->shard_n < 0 || (r->shard_n > 0 && (r->shard_k < 0 || r->shard_k >= r->shard_n))) abort();
    if (r->resume && !r->output) abort();
    if (r->sp.top_p <= 0 || r->sp.top_p > 1 || r->sp.temp < 0) abort();
    if (o->so.kv_rate < 0 || o->so.kv_rate > 1 || o->so.keep < 0 || o->so.keep > 1) abort();
    if (o->so.pool_kernel % 2 == 0 || o->so.spec_pool % 2 == 0) abort();
    if (o->so.pool < 0 || o->so.pool > 1 || o->so.kv_len < 0 || o->so.tsp_len < 0) abort();
    if (o->so.keep_last != 0 && o->so.keep_last != 1) abort();
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
