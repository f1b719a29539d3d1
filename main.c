// main.c — the sift command line: flags -> load model -> run the prompts (cmd/run.c: tokenize -> run the
// strategy -> print text (stdout) and timing (stderr), or one JSON line per prompt (--json).
// Never interactive. Exit codes: 0 ok, 1 a prompt or the model failed, 2 bad usage.
#include <dirent.h>
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
#include "util/check.h"

typedef struct {
    const char *model, *device, *batch_dir, *draft_path;
    enum bk_weights weights;   // --weights native|f32 (CPU)
    int ctx;
    run_opts r;                // what runs: prompts, sampling, strategies, output
    strategy_opts so;
} options;

static void print_help(void) {
    printf(
        "sift %s — run a prompt through a Llama-family model with a long-context strategy\n\n"
        "usage: sift [options] (-p TEXT | -f FILE... | --batch DIR | --prompts FILE.jsonl)\n"
        "       sift bench [-m MODEL|synthetic:NAME] [--ctx 1024,8192] [-n 128] [-r 5]\n"
        "                  (see sift bench --help)\n"
        "       sift eval [-m MODEL] [--strategy all] [--ctx 1024,...]  (see sift eval --help)\n"
        "       sift ppl [-m MODEL] -f TEXT [--ctx 512]                 (see sift ppl --help)\n"
        "       sift fit-phi [-m MODEL] --data TEXT --out FILE.phi   (see sift fit-phi --help)\n\n"
        "model and input\n"
        "  -m, --model PATH        GGUF file or Hugging Face directory (config.json,\n"
        "                          safetensors, tokenizer.json) (default: %s beside the binary)\n"
        "  -p, --prompt TEXT       prompt text\n"
        "  -f, --file PATH         prompt file ('-' = stdin); may be given several times\n"
        "      --batch DIR         every .txt file in DIR, in name order\n"
        "      --prompts FILE      JSON Lines, one request per line ('-' = stdin): sift's fields\n"
        "                          id, prompt | messages, system, n_predict, temp, seed,\n"
        "                          strategy; or the OpenAI Batch API shape (custom_id,\n"
        "                          body.messages, body.max_tokens, body.temperature, ...)\n"
        "      --chat              wrap the prompt in the model's chat template\n"
        "      --system TEXT       system message for --chat (implies --chat)\n"
        "generation\n"
        "  -n, --n-predict N       tokens to generate (default 128; -1 = until end of text)\n"
        "  -c, --ctx-size N        context size (default 0 = the model's)\n"
        "      --temp T            temperature (default 0.8; 0 = greedy)\n"
        "      --top-k K           keep the K most likely tokens (default 40; 0 = off)\n"
        "      --top-p P           nucleus sampling (default 0.95; 1 = off)\n"
        "      --min-p P           drop tokens below P x the top probability (default 0.05)\n"
        "  -s, --seed N            sampling seed (default -1 = random, reported)\n"
        "strategy and device\n"
        "      --strategy LIST     one strategy, or a comma list / all for an A/B comparison\n"
        "                          on the same tokens: %s (default full)\n"
        "      --device D          auto | cpu | cuda (default auto: cuda when a GPU is usable;\n"
        "                          --device cuda says why one is not)\n"
        "  -t, --threads N         CPU threads (default: all cores)\n"
        "      --weights W         CPU weights: native (as the file stores them, 8-bit\n"
        "                          activation products; default) | f32 (dequantised, the reference)\n"
        "strategy parameters (defaults from each strategy's paper)\n",
        SIFT_VERSION, DEFAULT_MODEL, strategy_names());
    cli_strategy_help(stdout);
    printf(
        "batch jobs\n"
        "      --parallel N        up to N prompts in flight; each decode step is one forward\n"
        "                          pass over all of them (default 1)\n"
        "      --output FILE       write the JSON records to FILE (refuses an existing FILE\n"
        "                          unless --resume)\n"
        "      --resume            skip the requests FILE already has, append the rest\n"
        "      --shard K/N         run the K-th (0-based) of N contiguous slices of the input\n"
        "      --unordered         write each record when it finishes, not in input order\n"
        "output\n"
        "      --json              one JSON object per prompt and strategy (JSON Lines), then a\n"
        "                          summary record when there are several\n"
        "  -q, --quiet             no progress or timing on stderr\n"
        "  -h, --help              this help\n"
        "      --version           version and backends\n\n"
        "examples\n"
        "  sift -p \"What is the capital of France?\" --chat -n 32 --temp 0\n"
        "  sift -m model.gguf -f prompt.txt -n 128 --temp 0.7 --top-p 0.9 --seed 7 --json\n"
        "  sift -f a.txt -f b.txt --json -q > results.jsonl\n"
        "  sift --batch prompts/ --chat --temp 0 -n 64\n"
        "  sift --prompts requests.jsonl --parallel 16 --output results.jsonl --resume\n"
        "  cat prompt.txt | sift -f - -n 64\n"
        "  sift -f long.txt --strategy full,speed,fastkv,specprefill -n 64 --temp 0\n");
}

static void add_file(run_opts *o, const char *path) {
    o->files = xrealloc(o->files, (size_t)(o->n_files + 1) * sizeof *o->files);
    o->files[o->n_files++] = strdup(path);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Adds every DIR/*.txt (sorted) to o->files.
static void add_batch_dir(run_opts *o, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) cli_usage_error("cannot open --batch directory '%s': %s", dir, strerror(errno));
    int first = o->n_files;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".txt") != 0) continue;
        char *path = xmalloc(strlen(dir) + n + 2);
        sprintf(path, "%s/%s", dir, e->d_name);
        add_file(o, path);
        free(path);
    }
    closedir(d);
    if (o->n_files == first) cli_usage_error("no .txt files in --batch directory '%s'", dir);
    qsort(o->files + first, (size_t)(o->n_files - first), sizeof *o->files, by_name);
}

// --shard K/N: 0 <= K < N
static void parse_shard(const char *v, run_opts *r) {
    char *end;
    long k = strtol(v, &end, 10), n = *end == '/' ? strtol(end + 1, &end, 10) : -1;
    if (*end || n < 1 || n > 1000000 || k < 0 || k >= n)
        cli_usage_error("--shard must be K/N with 0 <= K < N (got '%s')", v);
    r->shard_k = (int)k, r->shard_n = (int)n;
}

static void parse_args(int argc, char **argv, options *o) {
    *o = (options){.device = "auto", .so = strategy_opts_default()};
    run_opts *r = &o->r;
    *r = (run_opts){.n_predict = 128, .seed = -1, .parallel = 1,
                    .sp = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f},
                    .strategies = {strategy_find("full")}, .n_strategies = 1, .so = &o->so};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_flag(a, "-h", "--help")) {
            print_help();
            exit(0);
        }
        if (cli_is_flag(a, NULL, "--version")) {
            printf("sift %s (backends: %s)\n", SIFT_VERSION, CLI_BACKENDS);
            exit(0);
        }
        if (cli_is_flag(a, NULL, "--chat")) { r->chat = 1; continue; }
        if (cli_is_flag(a, NULL, "--json")) { r->json = 1; continue; }
        if (cli_is_flag(a, "-q", "--quiet")) { r->quiet = 1; continue; }
        if (cli_is_flag(a, NULL, "--resume")) { r->resume = 1; continue; }
        if (cli_is_flag(a, NULL, "--unordered")) { r->unordered = 1; continue; }
        if (a[0] != '-' || !a[1]) cli_usage_error("unexpected argument '%s'", a);
        if (i + 1 >= argc) {
            if (strncmp(a, "--", 2) == 0 || strlen(a) == 2) {
                static const char *known[] = {"-m", "--model", "-p", "--prompt", "-f", "--file",
                    "--batch", "--system", "-n", "--n-predict", "-c", "--ctx-size", "-t",
                    "--threads", "--temp", "--top-k", "--top-p", "--min-p", "-s", "--seed",
                    "--strategy", "--device", "--weights", "--prompts", "--parallel", "--output",
                    "--shard"};
                for (size_t k = 0; k < sizeof known / sizeof *known; k++)
                    if (strcmp(a, known[k]) == 0) cli_usage_error("%s needs a value", a);
                if (cli_is_strategy_flag(a)) cli_usage_error("%s needs a value", a);
            }
            cli_usage_error("unknown flag '%s'", a);
        }
        const char *v = argv[i + 1];
        if (cli_is_flag(a, "-m", "--model")) o->model = v;
        else if (cli_is_flag(a, "-p", "--prompt")) r->prompt = v;
        else if (cli_is_flag(a, "-f", "--file")) add_file(r, v);
        else if (cli_is_flag(a, NULL, "--batch")) o->batch_dir = v;
        else if (cli_is_flag(a, NULL, "--prompts")) r->prompts_path = v;
        else if (cli_is_flag(a, NULL, "--system")) { r->system = v; r->chat = 1; }
        else if (cli_is_flag(a, "-n", "--n-predict")) r->n_predict = (int)cli_int(a, v, -1, INT_MAX);
        else if (cli_is_flag(a, "-c", "--ctx-size")) o->ctx = (int)cli_int(a, v, 0, 1 << 22);
        else if (cli_is_flag(a, "-t", "--threads")) r->threads = (int)cli_int(a, v, 1, 1024);
        else if (cli_is_flag(a, NULL, "--temp")) r->sp.temp = cli_float(a, v, 0, 100);
        else if (cli_is_flag(a, NULL, "--top-k")) r->sp.top_k = (int)cli_int(a, v, 0, INT_MAX);
        else if (cli_is_flag(a, NULL, "--top-p")) r->sp.top_p = cli_float(a, v, 1e-6, 1);
        else if (cli_is_flag(a, NULL, "--min-p")) r->sp.min_p = cli_float(a, v, 0, 1);
        else if (cli_is_flag(a, "-s", "--seed")) r->seed = cli_int(a, v, -1, UINT32_MAX);
        else if (cli_is_flag(a, NULL, "--strategy")) r->n_strategies = cli_strategies(v, r->strategies);
        else if (cli_is_flag(a, NULL, "--device")) o->device = cli_device(v);
        else if (cli_is_flag(a, NULL, "--weights")) o->weights = cli_weights(v);
        else if (cli_is_flag(a, NULL, "--parallel")) r->parallel = (int)cli_int(a, v, 1, FWD_MAX_BATCH - MAX_STRATEGIES);
        else if (cli_is_flag(a, NULL, "--output")) r->output = v;
        else if (cli_is_flag(a, NULL, "--shard")) parse_shard(v, r);
        else if (!cli_strategy_flag(a, v, &o->so, &o->draft_path)) cli_usage_error("unknown flag '%s'", a);
        i++;
    }
    int sources = (r->prompt != NULL) + (r->n_files > 0) + (o->batch_dir != NULL) + (r->prompts_path != NULL);
    if (sources == 0) cli_usage_error("no prompt: give -p TEXT, -f FILE, --batch DIR or --prompts FILE.jsonl");
    if (r->prompt && sources > 1) cli_usage_error("-p cannot be combined with -f, --batch or --prompts");
    if (r->n_predict == 0) cli_usage_error("-n 0 generates nothing: use -1 or a positive count");
    if (o->draft_path && o->so.draft_layers)
        cli_usage_error("--draft and --draft-layers exclude each other (a draft model, or the main "
                    "model's first layers)");
    if (r->resume && !r->output) cli_usage_error("--resume needs --output FILE (the file to continue)");
    if (r->output && !r->resume && access(r->output, F_OK) == 0)
        cli_usage_error("--output '%s' exists: add --resume to continue it, or remove it", r->output);
    if (r->unordered && !(r->json || r->output))
        cli_usage_error("--unordered orders JSON records: add --json or --output FILE");
    if (o->batch_dir) add_batch_dir(r, o->batch_dir);
    if (r->threads == 0) r->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    o->so.n_threads = r->threads;
}

// Prefill progress on an interactive stderr: "prefill: layer 12/30".
static void show_layer(void *ctx, int layer, int n_layer, int rows) {
    (void)ctx;
    fprintf(stderr, "\rprefill: layer %d/%d (%d rows)   ", layer + 1, n_layer, rows);
    if (layer + 1 == n_layer) fprintf(stderr, "\r%40s\r", "");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "bench") == 0) return cmd_bench(argc, argv);
    if (argc > 1 && strcmp(argv[1], "eval") == 0) return cmd_eval(argc, argv);
    if (argc > 1 && strcmp(argv[1], "ppl") == 0) return cmd_ppl(argc, argv);
    if (argc > 1 && strcmp(argv[1], "fit-phi") == 0) return cmd_fit_phi(argc, argv);
    options o;
    parse_args(argc, argv, &o);
    if (cli_refuse_synthetic(o.model, "a prompt")) return 2;
    double t0 = now_ms();
    loaded L;
    cli_hw hw = {o.device, o.r.threads, o.weights, o.ctx, GGML_F32};
    int rc = cli_load(&L, o.model, o.draft_path, &hw, o.r.strategies, o.r.n_strategies, &o.so);
    if (rc == 0) {
        model *m = L.m;
        const char *dev = L.bk->name;
        double load_ms = now_ms() - t0;
        if (!o.r.quiet && isatty(2) && o.r.parallel == 1) m->on_layer = show_layer;
        if (!o.r.quiet)
            fprintf(stderr, "sift: loaded %s (%s, %d layers, %.0fM params, %.2f GiB) in %.0f ms on "
                    "%s%s%s%s\n", cli_base_name(L.path), m->cfg.arch, m->cfg.n_layer,
                    m->n_params / 1e6, m->weight_bytes / 1073741824.0, load_ms, dev,
                    L.bk->info[0] ? " (" : "", L.bk->info, L.bk->info[0] ? ")" : "");
        if (o.ctx > m->cfg.ctx_len && !o.r.quiet)
            fprintf(stderr, "sift: warning: -c %d is beyond the model's trained context %d\n", o.ctx,
                    m->cfg.ctx_len);
        rc = run_prompts(&o.r, m, L.t, dev, m->name ? m->name : cli_base_name(L.path), load_ms,
                         o.ctx > 0 ? o.ctx : m->cfg.ctx_len);
    }
    cli_unload(&L);
    for (int i = 0; i < o.r.n_files; i++) free(o.r.files[i]);
    free(o.r.files);
    return rc;
}
