// main.c — the sift command line: flags -> load model -> run the prompts (jobs/: tokenize -> run the
// strategy -> print text (stdout) and timing (stderr), or one JSON line per prompt (--json).
// Never interactive. Exit codes: 0 ok, 1 a prompt or the model failed, 2 bad usage.
#include <dirent.h>
#include <stddef.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "backend/backend.h"
#include "util/check.h"

typedef struct {
    const char *model, *device, *batch_dir, *draft_path;
    enum bk_weights weights;   // --weights native|fast|exact|f32 (CPU)
    int ctx;
    run_opts r;                // what runs: prompts, sampling, strategies, output
    strategy_opts so;
    strategy_run run;          // the draft and end-of-generation test (cli_load), --kept-map
} options;

// --shard K/N: 0 <= K < N
static void parse_shard(const char *v, run_opts *r) {
    char *end;
    long k = strtol(v, &end, 10), n = *end == '/' ? strtol(end + 1, &end, 10) : -1;
    if (*end || n < 1 || n > 1000000 || k < 0 || k >= n)
        cli_usage_error("--shard must be K/N with 0 <= K < N (got '%s')", v);
    r->shard_k = (int)k, r->shard_n = (int)n;
}

// --output / --errors FILE: an existing regular file only with --resume (which reads and rewrites
// it, so never a device, pipe or directory); a device or pipe without --resume is written in place.
static void check_records_file(const char *flag, const char *path, int resume) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return;   // a new file (or one jobs_run reports it cannot open)
    if (S_ISDIR(st.st_mode)) cli_usage_error("%s '%s' is a directory", flag, path);
    if (S_ISREG(st.st_mode) && !resume)
        cli_usage_error("%s '%s' exists: add --resume to continue it, or remove it", flag, path);
    if (!S_ISREG(st.st_mode) && resume)
        cli_usage_error("%s '%s' is not a regular file (a device or pipe): --resume reads and "
                        "rewrites a file; write to a file, or leave out --resume", flag, path);
}

// ---- the flags: one table (type, field, range, default, help) for the parser and --help; the
// strategy parameters have theirs in policies/options.c ----

typedef enum { F_SWITCH, F_STR, F_INT, F_LLONG, F_FLOAT, F_CALL } flag_type;

typedef struct flag_row {
    const char *section;              // starts a --help section when set
    const char *s, *l, *metavar;      // -n, --n-predict, N
    flag_type type;
    size_t off;                       // of the field in options
    double lo, hi;                    // F_INT, F_LLONG, F_FLOAT
    double def;                       // F_INT, F_LLONG, F_FLOAT, F_SWITCH (set before parsing)
    void (*call)(options *o, const char *v);   // F_CALL: parses v (or NULL: a switch)
    const char *help;                 // may hold %s: the default model / the strategy names
} flag_row;

#define O(f) offsetof(options, f)
static void set_file(options *o, const char *v) { jobs_add_file(&o->r, v); }
static void set_system(options *o, const char *v) { o->r.system = v, o->r.chat = 1; }
static void set_strategy(options *o, const char *v) { o->r.n_strategies = cli_strategies(v, o->r.strategies); }
static void set_device(options *o, const char *v) { o->device = cli_device(v); }
static void set_weights(options *o, const char *v) { o->weights = cli_weights(v); }
static void set_shard(options *o, const char *v) { parse_shard(v, &o->r); }
static void set_format(options *o, const char *v) {
    if (strcmp(v, "auto") == 0) o->r.format = RUN_FORMAT_AUTO;
    else if (strcmp(v, "sift") == 0) o->r.format = RUN_FORMAT_SIFT;
    else if (strcmp(v, "openai") == 0) o->r.format = RUN_FORMAT_OPENAI;
    else cli_usage_error("--output-format must be auto, sift or openai (got '%s')", v);
}
static void show_help(options *o, const char *v);
static void show_version(options *o, const char *v) {
    (void)o, (void)v;
    printf("sift %s (backends: %s)\n", SIFT_VERSION, CLI_BACKENDS);
    exit(cli_finish_stdout(0));
}

static const flag_row FLAGS[] = {
    {"model and input", "-m", "--model", "PATH", F_STR, O(model), 0, 0, 0, NULL,
     "GGUF file or Hugging Face directory (config.json, safetensors, tokenizer.json) (default: "
     "%s beside the binary, or $SIFT_MODEL)"},
    {NULL, "-p", "--prompt", "TEXT", F_STR, O(r.prompt), 0, 0, 0, NULL, "prompt text"},
    {NULL, "-f", "--file", "PATH", F_CALL, 0, 0, 0, 0, set_file,
     "prompt file ('-' = stdin); may be given several times"},
    {NULL, NULL, "--batch", "DIR", F_STR, O(batch_dir), 0, 0, 0, NULL,
     "every .txt file in DIR, in name order"},
    {NULL, NULL, "--prompts", "FILE", F_STR, O(r.prompts_path), 0, 0, 0, NULL,
     "JSON Lines, one request per line ('-' = stdin): sift's fields id, prompt | messages, "
     "system, n_predict, temp, seed, strategy; or the OpenAI Batch API shape (custom_id, "
     "body.messages, body.max_tokens, body.temperature, ...)"},
    {NULL, NULL, "--chat", NULL, F_SWITCH, O(r.chat), 0, 0, 0, NULL,
     "wrap the prompt in the model's chat template"},
    {NULL, NULL, "--system", "TEXT", F_CALL, 0, 0, 0, 0, set_system,
     "system message for --chat (implies --chat)"},
    {"generation", "-n", "--n-predict", "N", F_INT, O(r.n_predict), -1, INT_MAX, 128, NULL,
     "tokens to generate (default 128; -1 = until end of text)"},
    {NULL, "-c", "--ctx-size", "N", F_INT, O(ctx), 0, 1 << 22, 0, NULL,
     "context size (default 0 = the model's)"},
    {NULL, NULL, "--temp", "T", F_FLOAT, O(r.sp.temp), 0, 100, 0.8, NULL,
     "temperature (default 0.8; 0 = greedy)"},
    {NULL, NULL, "--top-k", "K", F_INT, O(r.sp.top_k), 0, INT_MAX, 40, NULL,
     "keep the K most likely tokens (default 40; 0 = off)"},
    {NULL, NULL, "--top-p", "P", F_FLOAT, O(r.sp.top_p), 1e-6, 1, 0.95, NULL,
     "nucleus sampling (default 0.95; 1 = off)"},
    {NULL, NULL, "--min-p", "P", F_FLOAT, O(r.sp.min_p), 0, 1, 0.05, NULL,
     "drop tokens below P x the top probability (default 0.05)"},
    {NULL, "-s", "--seed", "N", F_LLONG, O(r.seed), -1, UINT32_MAX, -1, NULL,
     "sampling seed (default -1 = random, reported)"},
    {"strategy and device", NULL, "--strategy", "LIST", F_CALL, 0, 0, 0, 0, set_strategy,
     "one strategy, or a comma list / all for an A/B comparison on the same tokens: %s "
     "(default full); or PREFILL+DECODE, a prefill strategy then a decode one (topk, topk+phi), "
     "e.g. fastkv+topk"},
    {NULL, "-r", "--repeat", "N", F_INT, O(r.reps), 1, 100, 1, NULL,
     "run each strategy N times per prompt, in rotating order after an untimed warm-up; the A/B "
     "table shows the median TTFT and TPOT with their spread, and says when other processes "
     "were busy (default 1)"},
    {NULL, NULL, "--device", "D", F_CALL, 0, 0, 0, 0, set_device,
     "auto | cpu | cuda (default auto: cuda when a GPU is usable; --device cuda says why one "
     "is not)"},
    {NULL, "-t", "--threads", "N", F_INT, O(r.threads), 1, 1024, 0, NULL,
     "CPU threads (default: $OMP_NUM_THREADS, else the physical cores)"},
    {NULL, NULL, "--weights", "W", F_CALL, 0, 0, 0, 0, set_weights,
     "CPU weights: native (as the file stores them; default) | fast (as stored, prefill on "
     "one-digit 8-bit activations with AVX-512 VNNI: llama.cpp's precision, faster) | exact (as "
     "stored, two-digit 16-bit activations on every product: slower prefill) | f32 (dequantised, "
     "the reference)"},
    {"batch jobs", NULL, "--parallel", "N", F_INT, O(r.parallel), 1, FWD_MAX_BATCH - MAX_STRATEGIES, 1,
     NULL, "up to N prompts in flight; each decode step is one forward pass over all of them "
     "(default 1)"},
    {NULL, NULL, "--output", "FILE", F_STR, O(r.output), 0, 0, 0, NULL,
     "write the JSON records to FILE (refuses an existing file unless --resume; a device or pipe "
     "is written in place); a second sift on FILE is refused (FILE.lock holds the pid)"},
    {NULL, NULL, "--resume", NULL, F_SWITCH, O(r.resume), 0, 0, 0, NULL,
     "keep every valid record FILE already has (one per request, damaged lines reported and "
     "redone, the file rewritten in input order when needed), run and append the rest"},
    {NULL, NULL, "--errors", "FILE", F_STR, O(r.errors), 0, 0, 0, NULL,
     "write the failed requests' records to FILE instead (as the Batch API's error file); "
     "--resume reads both"},
    {NULL, NULL, "--retry-failed", NULL, F_SWITCH, O(r.retry_failed), 0, 0, 0, NULL,
     "with --resume: run the failed requests again (their error records are replaced)"},
    {NULL, NULL, "--wait-lock", NULL, F_SWITCH, O(r.wait_lock), 0, 0, 0, NULL,
     "when another sift writes --output FILE, wait for it to end instead of refusing"},
    {NULL, NULL, "--shard", "K/N", F_CALL, 0, 0, 0, 0, set_shard,
     "run the K-th (0-based) of N contiguous slices of the input"},
    {NULL, NULL, "--unordered", NULL, F_SWITCH, O(r.unordered), 0, 0, 0, NULL,
     "write each record when it finishes, not in input order"},
    {NULL, NULL, "--kept-map", "FILE", F_STR, O(r.kept_map), 0, 0, 0, NULL,
     "draw what each strategy kept into FILE (one self-contained HTML page: per prompt and "
     "strategy, cache layers x prompt tokens, kept or read by decode, the prompt under it, the "
     "answer and agreement beside it) and the same data as JSON (FILE with .json)"},
    {NULL, NULL, "--summary", "FILE", F_STR, O(r.summary), 0, 0, 0, NULL,
     "write the run's summary (prompts, failures, tokens, rates) to FILE as one JSON object; "
     "it also goes to stderr, never among the records"},
    {"output", NULL, "--json", NULL, F_SWITCH, O(r.json), 0, 0, 0, NULL,
     "one JSON object per prompt and strategy (JSON Lines)"},
    {NULL, NULL, "--output-format", "F", F_CALL, 0, 0, 0, 0, set_format,
     "the JSON records' shape: sift (text, strategy, settings, timings, agreement) | openai (the "
     "Batch API's output objects: id, custom_id, response.body as a chat.completion, error; one "
     "strategy) | auto (default: openai when every --prompts line that is JSON is a Batch API "
     "request and one strategy runs, else sift)"},
    {NULL, "-q", "--quiet", NULL, F_SWITCH, O(r.quiet), 0, 0, 0, NULL,
     "no progress or timing on stderr"},
    {NULL, "-h", "--help", NULL, F_SWITCH, 0, 0, 0, 0, show_help, "this help"},
    {NULL, NULL, "--version", NULL, F_SWITCH, 0, 0, 0, 0, show_version, "version and backends"},
};
#define N_FLAGS (int)(sizeof FLAGS / sizeof *FLAGS)

// "  -n, --n-predict N        text" (cli_help_line)
static void help_line(const flag_row *f) {
    char head[64], text[600];
    snprintf(head, sizeof head, "%s%s%s%s%s", f->s ? f->s : "", f->s ? ", " : "    ", f->l,
             f->metavar ? " " : "", f->metavar ? f->metavar : "");
    snprintf(text, sizeof text, f->help, strstr(f->help, "%s") == NULL ? "" :
             strcmp(f->l, "--model") == 0 ? DEFAULT_MODEL : strategy_names());
    cli_help_line(stdout, 2, head, text);
}

static void show_help(options *o, const char *v) {
    (void)o, (void)v;
    printf("sift %s — run a prompt through a Llama-family model with a long-context strategy\n\n"
           "usage: sift [options] (-p TEXT | -f FILE... | --batch DIR | --prompts FILE.jsonl)\n"
           "       sift bench [-m MODEL|synthetic:NAME] [--ctx 1024,8192] [-n 128] [-r 5]\n"
           "                  (see sift bench --help)\n"
           "       sift eval [-m MODEL] [--strategy all] [--ctx 1024,...]  (see sift eval --help)\n"
           "       sift sweep [-m MODEL] (-f FILE... | --tasks niah,...) [--grid SPEC] [--min-agreement X]\n"
           "                  (strategies x settings, Pareto frontier; see sift sweep --help)\n"
           "       sift ppl [-m MODEL] -f TEXT [--ctx 512]                 (see sift ppl --help)\n"
           "       sift fit-phi [-m MODEL] --data TEXT --out FILE.phi   (see sift fit-phi --help)\n",
           SIFT_VERSION);
    for (int i = 0; i < N_FLAGS; i++) {
        if (FLAGS[i].section) {
            if (strcmp(FLAGS[i].section, "batch jobs") == 0) {   // the strategy table before it
                printf("strategy parameters (defaults from each strategy's paper)\n");
                cli_strategy_help(stdout);
            }
            printf("%s%s\n", i ? "" : "\n", FLAGS[i].section);
        }
        help_line(&FLAGS[i]);
    }
    printf("\nexamples\n"
           "  sift -p \"What is the capital of France?\" --chat -n 32 --temp 0\n"
           "  sift -m model.gguf -f prompt.txt -n 128 --temp 0.7 --top-p 0.9 --seed 7 --json\n"
           "  sift -f a.txt -f b.txt --json -q > results.jsonl\n"
           "  sift --batch prompts/ --chat --temp 0 -n 64\n"
           "  sift --prompts requests.jsonl --parallel 16 --output results.jsonl --resume\n"
           "  sift --prompts openai_batch.jsonl --output batch_output.jsonl --summary summary.json\n"
           "  cat prompt.txt | sift -f - -n 64\n"
           "  sift -f long.txt --strategy full,speed,fastkv,specprefill -n 64 --temp 0\n");
    exit(cli_finish_stdout(0));
}

static void parse_args(int argc, char **argv, options *o) {
    *o = (options){.device = "auto", .so = strategy_opts_default()};
    run_opts *r = &o->r;
    *r = (run_opts){.strategies = {strategy_find("full")}, .n_strategies = 1, .so = &o->so,
                    .run = &o->run};
    for (int k = 0; k < N_FLAGS; k++) {   // the table's defaults
        char *field = (char *)o + FLAGS[k].off;
        if (FLAGS[k].type == F_INT) *(int *)field = (int)FLAGS[k].def;
        else if (FLAGS[k].type == F_LLONG) *(long long *)field = (long long)FLAGS[k].def;
        else if (FLAGS[k].type == F_FLOAT) *(float *)field = (float)FLAGS[k].def;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const flag_row *f = NULL;
        for (int k = 0; k < N_FLAGS && !f; k++)
            if (cli_is_flag(a, FLAGS[k].s, FLAGS[k].l)) f = &FLAGS[k];
        if (f && f->type == F_SWITCH) {
            if (f->call) f->call(o, NULL);
            else *(int *)((char *)o + f->off) = 1;
            continue;
        }
        if (a[0] != '-' || !a[1]) cli_usage_error("unexpected argument '%s'", a);
        if (i + 1 >= argc) {
            if (f || cli_is_strategy_flag(a)) cli_usage_error("%s needs a value", a);
            cli_usage_error("unknown flag '%s'", a);
        }
        const char *v = argv[++i];
        if (!f) {
            if (!cli_strategy_flag(a, v, &o->so, &o->draft_path)) cli_usage_error("unknown flag '%s'", a);
            continue;
        }
        char *field = (char *)o + f->off;
        switch (f->type) {
        case F_STR: *(const char **)field = v; break;
        case F_INT: *(int *)field = (int)cli_int(a, v, (long long)f->lo, (long long)f->hi); break;
        case F_LLONG: *(long long *)field = cli_int(a, v, (long long)f->lo, (long long)f->hi); break;
        case F_FLOAT: *(float *)field = cli_float(a, v, f->lo, f->hi); break;
        default: f->call(o, v); break;
        }
    }
    int sources = (r->prompt != NULL) + (r->n_files > 0) + (o->batch_dir != NULL) + (r->prompts_path != NULL);
    if (sources == 0) cli_usage_error("no prompt: give -p TEXT, -f FILE, --batch DIR or --prompts FILE.jsonl");
    if (r->prompt && sources > 1) cli_usage_error("-p cannot be combined with -f, --batch or --prompts");
    if (r->n_predict == 0) cli_usage_error("-n 0 generates nothing: use -1 or a positive count");
    if (o->draft_path && o->so.draft_layers)
        cli_usage_error("--draft and --draft-layers exclude each other (a draft model, or the main "
                    "model's first layers)");
    if (r->resume && !r->output) cli_usage_error("--resume needs --output FILE (the file to continue)");
    if (r->retry_failed && !r->resume)
        cli_usage_error("--retry-failed reruns the failed requests of a finished job: add --resume");
    if (r->errors && !r->output && !r->json)
        cli_usage_error("--errors FILE holds failed requests' JSON records: add --output FILE or --json");
    if (r->errors && r->output && strcmp(r->errors, r->output) == 0)
        cli_usage_error("--errors and --output name the same file '%s'", r->output);
    check_records_file("--output", r->output, r->resume);
    check_records_file("--errors", r->errors, r->resume);
    if (r->format == RUN_FORMAT_OPENAI) {
        if (r->n_strategies > 1)
            cli_usage_error("--output-format openai writes one response per custom_id: give one "
                            "--strategy (or use --output-format sift for an A/B comparison)");
        r->json = 1;
    }
    o->run.count_selected = r->kept_map != NULL;
    if (r->unordered && !(r->json || r->output))
        cli_usage_error("--unordered orders JSON records: add --json or --output FILE");
    char err[512];
    if (o->batch_dir && jobs_add_batch_dir(r, o->batch_dir, err, sizeof err)) cli_usage_error("%s", err);
    if (r->threads == 0) r->threads = backend_cpu_default_threads(NULL);
}

// Prefill progress on an interactive stderr: "prefill: layer 12/30".
static void show_layer(void *ctx, int layer, int n_layer, int rows) {
    (void)ctx;
    fprintf(stderr, "\rprefill: layer %d/%d (%d row%s)   ", layer + 1, n_layer, rows, plural_s(rows));
    if (layer + 1 == n_layer) fprintf(stderr, "\r%40s\r", "");
}

// Every command ends with stdout checked (cli_finish_stdout): text lost to a full disk is an
// error, not exit 0. (The early returns are errors already.)
int main(int argc, char **argv) {
    backend_cpu_blas_init(argv);
    if (argc > 1 && strcmp(argv[1], "bench") == 0) return cli_finish_stdout(cmd_bench(argc, argv));
    if (argc > 1 && strcmp(argv[1], "eval") == 0) return cli_finish_stdout(cmd_eval(argc, argv));
    if (argc > 1 && strcmp(argv[1], "sweep") == 0) return cli_finish_stdout(cmd_sweep(argc, argv));
    if (argc > 1 && strcmp(argv[1], "ppl") == 0) return cli_finish_stdout(cmd_ppl(argc, argv));
    if (argc > 1 && strcmp(argv[1], "fit-phi") == 0) return cli_finish_stdout(cmd_fit_phi(argc, argv));
    options o;
    parse_args(argc, argv, &o);
    if (cli_refuse_synthetic(o.model, "a prompt")) return 2;
    cli_threads_check("-t", o.r.threads);
    // the files written: a bad path (a missing or unwritable directory) fails now, not after the
    // model load or a long run; nothing is modified until then (an old summary or map stays whole
    // if the run fails)
    char *km_json = o.r.kept_map ? jobs_kept_map_json(o.r.kept_map) : NULL;
    const char *late[5] = {o.r.output, o.r.errors, o.r.summary, o.r.kept_map, km_json};
    int bad_out = cli_check_outputs(late, (const char *[]){"--output", "--errors", "--summary",
                                                           "--kept-map", "--kept-map"}, 5);
    free(km_json);
    if (bad_out) return 2;
    double t0 = now_ms();
    loaded L;
    cli_hw hw = {o.device, o.r.threads, o.weights, o.ctx, GGML_F32};
    int rc = cli_load(&L, o.model, o.draft_path, &hw, o.r.strategies, o.r.n_strategies, &o.so,
                    &o.run);
    if (rc == 0) {
        model *m = L.m;
        const char *dev = L.bk->name;
        double load_ms = now_ms() - t0;
        if (!o.r.quiet && isatty(2) && o.r.parallel == 1) m->on_layer = show_layer;
        // the model as the user named it (the file), the name it carries inside beside it
        char label[300];
        const char *inside;
        cli_model_label(L.path, m->name, label, sizeof label, &inside);
        if (!o.r.quiet)
            fprintf(stderr, "sift: loaded %s (%s%s%s%s, %d layer%s, %.0fM params, %.2f GiB) in %.0f ms on "
                    "%s%s%s%s\n", label, inside ? "named \"" : "", inside ? inside : "",
                    inside ? "\" inside; " : "", m->cfg.arch, m->cfg.n_layer, plural_s(m->cfg.n_layer),
                    m->n_params / 1e6, m->weight_bytes / 1073741824.0, load_ms, dev,
                    L.bk->info[0] ? " (" : "", L.bk->info, L.bk->info[0] ? ")" : "");
        if (o.ctx > m->cfg.ctx_len && !o.r.quiet)
            fprintf(stderr, "sift: warning: -c %d is beyond the model's trained context %d\n", o.ctx,
                    m->cfg.ctx_len);
        rc = jobs_run(&o.r, m, L.t, dev, m->name ? m->name : cli_base_name(L.path), load_ms,
                         o.ctx > 0 ? o.ctx : m->cfg.ctx_len);
    }
    cli_unload(&L);
    for (int i = 0; i < o.r.n_files; i++) free(o.r.files[i]);
    free(o.r.files);
    return cli_finish_stdout(rc);
}
