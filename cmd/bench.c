// cmd/bench.c — `sift bench`.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../util/check.h"
#include "cmd.h"

// ---- sift bench -----------------------------------------------------------------------------
// llama-bench in spirit: for each prompt length P, prefill P seeded random tokens, then decode
// N tokens at that depth (greedy, end-of-text ignored); R repetitions, each running every chosen
// strategy on the same tokens in turn, so the ratios against `full` come from the same run.

typedef struct {
    const char *model, *format, *draft_path;
    int lens[16], n_lens, n_gen, reps, threads;
    const strategy *strategies[MAX_STRATEGIES];
    int n_strategies;
    strategy_opts so;
} bench_opts;

typedef struct {
    double pp[1000], tg[1000], ttft[1000];
    size_t kv_bytes;
    long rows_done;
} bench_stats;

static int bench_ignore(void *ctx, int id) {
    (void)ctx;
    (void)id;
    return 0;
}

static void mean_sd(const double *x, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

static void bench_parse(int argc, char **argv, bench_opts *b) {
    *b = (bench_opts){.format = "md", .n_gen = 128, .reps = 3, .lens = {512}, .n_lens = 1,
                      .strategies = {strategy_find("full")}, .n_strategies = 1,
                      .so = strategy_opts_default()};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_flag(a, "-h", "--help")) {
            printf("usage: sift bench [-m MODEL] [-p 512,2048] [-n 128] [-r 3] [-t N]\n"
                   "                  [--strategy NAME,...|all] [strategy flags] [-o md|jsonl]\n"
                   "prefill P random tokens, then decode N at that depth; mean ± sd of R runs;\n"
                   "'x full' columns are ratios of means against full in the same run\n");
            exit(0);
        }
        if (i + 1 >= argc) cli_usage_error("bench: %s needs a value", a);
        const char *v = argv[++i];
        if (cli_is_flag(a, "-m", "--model")) b->model = v;
        else if (cli_is_flag(a, "-n", "--n-gen")) b->n_gen = (int)cli_int(a, v, 1, 1 << 20);
        else if (cli_is_flag(a, "-r", "--reps")) b->reps = (int)cli_int(a, v, 1, 1000);
        else if (cli_is_flag(a, "-t", "--threads")) b->threads = (int)cli_int(a, v, 1, 1024);
        else if (cli_is_flag(a, NULL, "--strategy")) b->n_strategies = cli_strategies(v, b->strategies);
        else if (cli_is_flag(a, "-o", "--output")) b->format = v;
        else if (cli_is_flag(a, "-p", "--n-prompt")) {
            char *copy = strdup(v), *save = NULL;
            b->n_lens = 0;
            for (char *t = strtok_r(copy, ",", &save); t && b->n_lens < 16; t = strtok_r(NULL, ",", &save))
                b->lens[b->n_lens++] = (int)cli_int(a, t, 1, 1 << 22);
            free(copy);
        } else if (!cli_strategy_flag(a, v, &b->so, &b->draft_path))
            cli_usage_error("bench: unknown flag '%s'", a);
    }
    if (strcmp(b->format, "md") && strcmp(b->format, "jsonl")) cli_usage_error("bench: -o must be md or jsonl");
    if (b->threads == 0) b->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    b->so.n_threads = b->threads;
}

// One rep of every strategy at prompt length P; 0 or -1.
static int bench_rep(const bench_opts *b, model *m, int P, int rep, bench_stats *bs) {
    int *ids = xmalloc((size_t)P * sizeof(int));
    sampler smp;
    sampler_init(&smp, &(sample_params){.temp = 0, .seed = (uint64_t)rep + 1}, m->cfg.vocab);
    for (int i = 0; i < P; i++) ids[i] = (int)(sample_uniform(&smp) * m->cfg.vocab) % m->cfg.vocab;
    int rc = 0;
    for (int k = 0; k < b->n_strategies && rc == 0; k++) {
        run_stats st;
        char err[512];
        fprintf(stderr, "bench: P=%d rep %d/%d %-14s\r", P, rep + 1, b->reps, b->strategies[k]->name);
        rc = run_generate(b->strategies[k], m, &b->so, ids, P, b->n_gen, &smp, bench_ignore, NULL,
                          &st, err, sizeof err);
        if (rc) fprintf(stderr, "sift: error: %s: %s\n", b->strategies[k]->name, err);
        bs[k].pp[rep] = cli_per_sec(P, st.prompt_ms);
        bs[k].tg[rep] = cli_per_sec(st.decode_runs, st.decode_ms);
        bs[k].ttft[rep] = st.prompt_ms;
        bs[k].kv_bytes = st.kv_bytes;
        bs[k].rows_done = st.rows_done;
    }
    sampler_free(&smp);
    free(ids);
    return rc;
}

static void bench_print(const bench_opts *b, const model *m, const char *name, int P,
                        const bench_stats *bs) {
    double full_pp = 0, full_tg = 0, sd;
    for (int k = 0; k < b->n_strategies; k++)
        if (strcmp(b->strategies[k]->name, "full") == 0) {
            mean_sd(bs[k].pp, b->reps, &full_pp, &sd);
            mean_sd(bs[k].tg, b->reps, &full_tg, &sd);
        }
    for (int k = 0; k < b->n_strategies; k++) {
        double ppm, pps, tgm, tgs, tm, ts;
        mean_sd(bs[k].pp, b->reps, &ppm, &pps);
        mean_sd(bs[k].tg, b->reps, &tgm, &tgs);
        mean_sd(bs[k].ttft, b->reps, &tm, &ts);
        double rows = 100.0 * bs[k].rows_done / ((double)P * m->cfg.n_layer);
        double ppx = full_pp > 0 ? ppm / full_pp : 0, tgx = full_tg > 0 ? tgm / full_tg : 0;
        const char *sn = b->strategies[k]->name;
        if (strcmp(b->format, "md") == 0)
            printf("| %s | %s | %s | %d | %d | %d | %.1f ± %.1f | %.2f ± %.2f | %.1f | %.2f | %.1f | %.2f | %.2f |\n",
                   name, sn, m->bk->name, b->threads, P, b->n_gen, ppm, pps, tgm, tgs, tm,
                   bs[k].kv_bytes / 1048576.0, rows, ppx, tgx);
        else
            printf("{\"model\":\"%s\",\"strategy\":\"%s\",\"backend\":\"%s\",\"threads\":%d,"
                   "\"n_prompt\":%d,\"n_gen\":%d,\"reps\":%d,\"pp_avg_ts\":%.3f,\"pp_stddev_ts\":%.3f,"
                   "\"tg_avg_ts\":%.3f,\"tg_stddev_ts\":%.3f,\"ttft_ms\":%.3f,\"kv_bytes\":%zu,"
                   "\"rows_pct_of_full\":%.3f,\"pp_x_full\":%.4f,\"tg_x_full\":%.4f}\n",
                   name, sn, m->bk->name, b->threads, P, b->n_gen, b->reps, ppm, pps, tgm, tgs, tm,
                   bs[k].kv_bytes, rows, ppx, tgx);
    }
    fflush(stdout);
}

int cmd_bench(int argc, char **argv) {
    bench_opts b;
    bench_parse(argc, argv, &b);
    loaded L;
    int rc = cli_load(&L, b.model, b.draft_path, "auto", b.threads, b.strategies, b.n_strategies,
                      &b.so);
    if (rc == 0 && strcmp(b.format, "md") == 0)
        printf("| model | strategy | backend | threads | prompt | gen | pp t/s | tg t/s | TTFT ms "
               "| KV MiB | rows %% | pp x full | tg x full |\n"
               "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    bench_stats *bs = xcalloc(MAX_STRATEGIES, sizeof *bs);
    for (int li = 0; li < b.n_lens && rc == 0; li++) {
        int P = b.lens[li];
        if ((long)P + b.n_gen > L.m->cfg.ctx_len) {
            fprintf(stderr, "sift: error: bench: %d + %d tokens exceed the context size %d\n", P,
                    b.n_gen, L.m->cfg.ctx_len);
            rc = 1;
        }
        for (int r = 0; r < b.reps && rc == 0; r++) rc = bench_rep(&b, L.m, P, r, bs);
        if (rc == 0) bench_print(&b, L.m, L.m->name ? L.m->name : cli_base_name(L.path), P, bs);
    }
    fprintf(stderr, "%50s\r", "");
    free(bs);
    cli_unload(&L);
    return rc;
}

