// main.c — the sift command line: flags -> load model -> for each prompt: tokenize -> run the
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
    const char *model, *prompt, *system, *device, *batch_dir, *draft_path;
    enum bk_weights weights;   // --weights native|f32 (CPU)
    char **files;          // -f (repeatable), then --batch entries (owned copies)
    int n_files;
    int n_predict, ctx, threads, chat, json, quiet;
    long long seed;
    sample_params sp;
    const strategy *strategies[MAX_STRATEGIES];   // --strategy a,b,c (A/B comparison)
    int n_strategies;
    strategy_opts so;
} options;

typedef struct {
    const char *label;     // file name, or "prompt"
    char *text;
    size_t len;
} prompt_in;

static void print_help(void) {
    printf(
        "sift %s — run a prompt through a Llama-family model with a long-context strategy\n\n"
        "usage: sift [options] (-p TEXT | -f FILE... | --batch DIR)\n"
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
        "strategy parameters (defaults from each strategy's paper)\n"
        "      --speed-depth K     speed: layers that see the prompt (default ceil(0.875 L))\n"
        "      --anchor bos|none   speed: keep the first prompt token in upper layers (bos)\n"
        "      --tsp-layer N       fastkv: token-selective propagation after layer N (L/2-1)\n"
        "      --tsp-rate R        fastkv: share of rows propagated, (0,1] (0.2)\n"
        "      --kv-rate R         fastkv, snapkv, streamingllm: KV kept per layer, (0,1] (0.1)\n"
        "      --window W          fastkv, snapkv: observation window, always kept (8)\n"
        "      --pool-kernel K     fastkv, snapkv: max-pool kernel, odd (7)\n"
        "      --keep P            specprefill: share of prompt chunks kept, (0,1] (0.3)\n"
        "      --lookahead N       specprefill: draft query rows incl. the last prompt token (8)\n"
        "      --chunk C           specprefill: chunk size in tokens (32)\n"
        "      --spec-pool K       specprefill: average-pool kernel, odd (13)\n"
        "      --draft MODEL       specprefill: draft model with the same vocabulary\n"
        "      --draft-layers N    specprefill: self-draft from the main model's first N layers\n"
        "                          (default without --draft: ceil(L/2))\n"
        "      --swiftkv-layers l  swiftkv: layers the whole prompt runs (L/2; a checkpoint's own)\n"
        "      --swiftkv-group G   swiftkv: layers sharing one KV cache, divides L-l (1)\n"
        "      --swiftkv-norm N    swiftkv training-free init: own = each layer's input norm\n"
        "                          folded into its K/V, shared = layer l's norm (shared)\n"
        "                          (swiftkv without a distilled checkpoint is EXPERIMENTAL:\n"
        "                          measured fidelity in bench/EVAL.md)\n"
        "      --sink N, --tail N  topk+phi, topk: anchors read exactly at decode (4, 16)\n"
        "      --topk K            topk+phi, topk: entries retrieved per query head; 0 = sink +\n"
        "                          tail only (default: from --budget)\n"
        "      --budget F          topk+phi, topk: exact reads as a share of the prompt, phi\n"
        "                          cache included (0.02)\n"
        "      --phi FILE          topk+phi: fitted maps (sift fit-phi); default: random features\n"
        "output\n"
        "      --json              one JSON object per prompt and strategy (JSON Lines)\n"
        "  -q, --quiet             no progress or timing on stderr\n"
        "  -h, --help              this help\n"
        "      --version           version and backends\n\n"
        "examples\n"
        "  sift -p \"What is the capital of France?\" --chat -n 32 --temp 0\n"
        "  sift -m model.gguf -f prompt.txt -n 128 --temp 0.7 --top-p 0.9 --seed 7 --json\n"
        "  sift -f a.txt -f b.txt --json -q > results.jsonl\n"
        "  sift --batch prompts/ --chat --temp 0 -n 64\n"
        "  cat prompt.txt | sift -f - -n 64\n"
        "  sift -f long.txt --strategy full,speed,fastkv,specprefill -n 64 --temp 0\n",
        SIFT_VERSION, DEFAULT_MODEL, strategy_names());
}

static void add_file(options *o, const char *path) {
    o->files = xrealloc(o->files, (size_t)(o->n_files + 1) * sizeof *o->files);
    o->files[o->n_files++] = strdup(path);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Adds every DIR/*.txt (sorted) to o->files.
static void add_batch_dir(options *o, const char *dir) {
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

static void parse_args(int argc, char **argv, options *o) {
    *o = (options){.device = "auto", .n_predict = 128, .seed = -1,
                   .sp = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f},
                   .strategies = {strategy_find("full")}, .n_strategies = 1,
                   .so = strategy_opts_default()};
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
        if (cli_is_flag(a, NULL, "--chat")) { o->chat = 1; continue; }
        if (cli_is_flag(a, NULL, "--json")) { o->json = 1; continue; }
        if (cli_is_flag(a, "-q", "--quiet")) { o->quiet = 1; continue; }
        if (a[0] != '-' || !a[1]) cli_usage_error("unexpected argument '%s'", a);
        if (i + 1 >= argc) {
            if (strncmp(a, "--", 2) == 0 || strlen(a) == 2) {
                static const char *known[] = {"-m", "--model", "-p", "--prompt", "-f", "--file",
                    "--batch", "--system", "-n", "--n-predict", "-c", "--ctx-size", "-t",
                    "--threads", "--temp", "--top-k", "--top-p", "--min-p", "-s", "--seed",
                    "--strategy", "--device", "--weights"};
                for (size_t k = 0; k < sizeof known / sizeof *known; k++)
                    if (strcmp(a, known[k]) == 0) cli_usage_error("%s needs a value", a);
                if (cli_is_strategy_flag(a)) cli_usage_error("%s needs a value", a);
            }
            cli_usage_error("unknown flag '%s'", a);
        }
        const char *v = argv[i + 1];
        if (cli_is_flag(a, "-m", "--model")) o->model = v;
        else if (cli_is_flag(a, "-p", "--prompt")) o->prompt = v;
        else if (cli_is_flag(a, "-f", "--file")) add_file(o, v);
        else if (cli_is_flag(a, NULL, "--batch")) o->batch_dir = v;
        else if (cli_is_flag(a, NULL, "--system")) { o->system = v; o->chat = 1; }
        else if (cli_is_flag(a, "-n", "--n-predict")) o->n_predict = (int)cli_int(a, v, -1, INT_MAX);
        else if (cli_is_flag(a, "-c", "--ctx-size")) o->ctx = (int)cli_int(a, v, 0, 1 << 22);
        else if (cli_is_flag(a, "-t", "--threads")) o->threads = (int)cli_int(a, v, 1, 1024);
        else if (cli_is_flag(a, NULL, "--temp")) o->sp.temp = cli_float(a, v, 0, 100);
        else if (cli_is_flag(a, NULL, "--top-k")) o->sp.top_k = (int)cli_int(a, v, 0, INT_MAX);
        else if (cli_is_flag(a, NULL, "--top-p")) o->sp.top_p = cli_float(a, v, 1e-6, 1);
        else if (cli_is_flag(a, NULL, "--min-p")) o->sp.min_p = cli_float(a, v, 0, 1);
        else if (cli_is_flag(a, "-s", "--seed")) o->seed = cli_int(a, v, -1, UINT32_MAX);
        else if (cli_is_flag(a, NULL, "--strategy")) o->n_strategies = cli_strategies(v, o->strategies);
        else if (cli_is_flag(a, NULL, "--device")) o->device = cli_device(v);
        else if (cli_is_flag(a, NULL, "--weights")) o->weights = cli_weights(v);
        else if (!cli_strategy_flag(a, v, &o->so, &o->draft_path)) cli_usage_error("unknown flag '%s'", a);
        i++;
    }
    int sources = (o->prompt != NULL) + (o->n_files > 0) + (o->batch_dir != NULL);
    if (sources == 0) cli_usage_error("no prompt: give -p TEXT, -f FILE or --batch DIR");
    if (o->prompt && sources > 1) cli_usage_error("-p cannot be combined with -f or --batch");
    if (o->n_predict == 0) cli_usage_error("-n 0 generates nothing: use -1 or a positive count");
    if (o->draft_path && o->so.draft_layers)
        cli_usage_error("--draft and --draft-layers exclude each other (a draft model, or the main "
                    "model's first layers)");
    if (o->batch_dir) add_batch_dir(o, o->batch_dir);
    if (o->threads == 0) o->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    o->so.n_threads = o->threads;
}

// ---- output ---------------------------------------------------------------------------------

typedef struct {
    char *buf;
    size_t len, cap;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->buf = xrealloc(b->buf, b->cap);
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
}

typedef struct {
    const tok *t;
    strbuf text;
    int *ids, n_ids;  // every sampled token, end-of-generation included
    int stream;       // print pieces to stdout as they come
    int hit_eog;
} gen_ctx;

static int on_token(void *ctx, int id) {
    gen_ctx *g = ctx;
    g->ids = xrealloc(g->ids, (size_t)(g->n_ids + 1) * sizeof(int));
    g->ids[g->n_ids++] = id;
    if (tok_is_eog(g->t, id)) {
        g->hit_eog = 1;
        return 1;
    }
    size_t n;
    const char *p = tok_piece(g->t, id, 0, &n);
    sb_put(&g->text, p, n);
    if (g->stream) {
        fwrite(p, 1, n, stdout);
        fflush(stdout);
    }
    return 0;
}


// One strategy's run on one prompt, and how it compares with `full` on the same prompt.
typedef struct {
    const strategy *s;
    run_stats st;
    gen_ctx g;
    int rc;
    char err[512];
    double rows_pct;        // prompt rows processed over layers, % of full's n * L
    int first_agree;        // first token equals full's (-1: full not run)
    double greedy_agree;    // % of full's generated tokens matched at the same step (-1: n/a)
} strat_run;

static void compare_with_full(strat_run *r, int n_runs, int n_prompt, int n_layer) {
    const strat_run *full = NULL;
    for (int i = 0; i < n_runs; i++)
        if (strcmp(r[i].s->name, "full") == 0 && r[i].rc == 0) full = &r[i];
    for (int i = 0; i < n_runs; i++) {
        r[i].rows_pct = 100.0 * r[i].st.rows_done / ((double)n_prompt * n_layer);
        r[i].first_agree = -1;
        r[i].greedy_agree = -1;
        if (!full || r[i].rc || full->g.n_ids == 0) continue;
        int same = 0;
        for (int t = 0; t < full->g.n_ids && t < r[i].g.n_ids; t++) same += full->g.ids[t] == r[i].g.ids[t];
        r[i].first_agree = r[i].g.n_ids > 0 && r[i].g.ids[0] == full->g.ids[0];
        r[i].greedy_agree = 100.0 * same / full->g.n_ids;
    }
}

static void print_timing(const options *o, const strat_run *r, double load_ms, const char *dev) {
    const run_stats *st = &r->st;
    fprintf(stderr, "\nsift: strategy %s, device %s (%d threads), KV cache %.2f MiB\n",
            r->s->name, dev, o->threads, st->kv_bytes / 1048576.0);
    if (st->note[0]) fprintf(stderr, "sift: %s: %s\n", r->s->name, st->note);
    fprintf(stderr, "      load time = %10.2f ms\n", load_ms);
    fprintf(stderr, "prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n",
            st->prompt_ms, st->prompt_n, cli_per_tok(st->prompt_n, st->prompt_ms), cli_per_sec(st->prompt_n, st->prompt_ms));
    fprintf(stderr, "       eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)\n",
            st->decode_ms, st->decode_runs, cli_per_tok(st->decode_runs, st->decode_ms), cli_per_sec(st->decode_runs, st->decode_ms));
    fprintf(stderr, "      total time = %10.2f ms / %5d tokens\n", st->prompt_ms + st->decode_ms,
            st->prompt_n + st->predicted_n);
}

static void print_json(const char *label, const char *model_name, const strat_run *r,
                       double load_ms, const char *dev, unsigned long long seed) {
    const run_stats *st = &r->st;
    printf("{\"file\":");
    cli_json_str(stdout, label, strlen(label));
    printf(",\"text\":");
    cli_json_str(stdout, r->g.text.buf ? r->g.text.buf : "", r->g.text.len);
    printf(",\"stop\":\"%s\",\"strategy\":\"%s\",\"device\":\"%s\",\"model\":",
           r->g.hit_eog ? "eos" : "limit", r->s->name, dev);
    cli_json_str(stdout, model_name, strlen(model_name));
    printf(",\"note\":");
    cli_json_str(stdout, st->note, strlen(st->note));
    printf(",\"seed\":%llu,\"kv_bytes\":%zu,\"load_ms\":%.3f,\"rows_processed\":%ld,"
           "\"rows_pct_of_full\":%.3f,", seed, st->kv_bytes, load_ms, st->rows_done, r->rows_pct);
    if (r->first_agree < 0) printf("\"first_token_agree\":null,\"greedy_agree_pct\":null,");
    else printf("\"first_token_agree\":%s,\"greedy_agree_pct\":%.2f,", r->first_agree ? "true" : "false", r->greedy_agree);
    printf("\"timings\":{\"prompt_n\":%d,\"prompt_ms\":%.3f,\"prompt_per_token_ms\":%.4f,"
           "\"prompt_per_second\":%.3f,\"predicted_n\":%d,\"predicted_ms\":%.3f,"
           "\"predicted_per_token_ms\":%.4f,\"predicted_per_second\":%.3f}}\n",
           st->prompt_n, st->prompt_ms, cli_per_tok(st->prompt_n, st->prompt_ms),
           cli_per_sec(st->prompt_n, st->prompt_ms), st->predicted_n, st->decode_ms,
           cli_per_tok(st->decode_runs, st->decode_ms), cli_per_sec(st->decode_runs, st->decode_ms));
    fflush(stdout);
}

static void print_json_error(const char *label, const char *strategy_name, const char *err) {
    printf("{\"file\":");
    cli_json_str(stdout, label, strlen(label));
    if (strategy_name) printf(",\"strategy\":\"%s\"", strategy_name);
    printf(",\"error\":");
    cli_json_str(stdout, err, strlen(err));
    printf("}\n");
    fflush(stdout);
}

// The A/B table after the texts: one row per strategy.
static void print_table(const strat_run *r, int n) {
    printf("\n| strategy | rows %% of full | KV MiB | TTFT ms | prefill tok/s | TPOT ms | decode tok/s "
           "| 1st token = full | greedy agree %% | first line |\n"
           "|---|---:|---:|---:|---:|---:|---:|:---:|---:|---|\n");
    for (int i = 0; i < n; i++) {
        const run_stats *st = &r[i].st;
        if (r[i].rc) {
            printf("| %s | error: %s |||||||||\n", r[i].s->name, r[i].err);
            continue;
        }
        const char *text = r[i].g.text.buf ? r[i].g.text.buf : "";
        while (*text == '\n' || *text == ' ') text++;
        int line = (int)strcspn(text, "\n|");
        if (line > 60) line = 60;
        printf("| %s | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f | %s | ", r[i].s->name, r[i].rows_pct,
               st->kv_bytes / 1048576.0, st->prompt_ms, cli_per_sec(st->prompt_n, st->prompt_ms),
               cli_per_tok(st->decode_runs, st->decode_ms), cli_per_sec(st->decode_runs, st->decode_ms),
               r[i].first_agree < 0 ? "-" : r[i].first_agree ? "yes" : "no");
        if (r[i].greedy_agree < 0) printf("- | ");
        else printf("%.1f | ", r[i].greedy_agree);
        printf("%.*s |\n", line, text);
    }
    fflush(stdout);
}

// ---- one prompt -----------------------------------------------------------------------------

typedef struct {
    const options *o;
    model *m;
    const tok *t;
    const char *dev;
    const char *model_name;
    double load_ms;
    int n_ctx;
} session;

static int prompt_ids(const session *s, const prompt_in *p, int **ids, char *err, size_t errlen) {
    if (p->len == 0) {
        snprintf(err, errlen, "prompt '%s' is empty", p->label);
        return -1;
    }
    long bad = tok_utf8_invalid_at(p->text, p->len);
    if (bad >= 0) {
        snprintf(err, errlen, "prompt '%s' is not valid UTF-8 (byte offset %ld, 0x%02x)", p->label,
                 bad, (unsigned char)p->text[bad]);
        return -1;
    }
    char *text = p->text;
    if (s->o->chat) {
        const char *sys = s->o->system ? s->o->system : tok_chat_default_system(s->t);
        text = tok_chat_apply(tok_chat_kind(s->t), sys, p->text);
        if (!text) {
            snprintf(err, errlen, "--chat: the model has no chat template sift knows (ChatML, Llama-3)");
            return -1;
        }
    }
    int *body = NULL;
    int n = tok_encode(s->t, text, strlen(text), 1, &body, err, errlen);
    if (text != p->text) free(text);
    if (n < 0) return -1;
    int bos = tok_add_bos(s->t) && tok_bos(s->t) >= 0;
    *ids = xmalloc((size_t)(n + bos + 1) * sizeof(int));
    if (bos) (*ids)[0] = tok_bos(s->t);
    memcpy(*ids + bos, body, (size_t)n * sizeof(int));
    free(body);
    return n + bos;
}

// Runs strategy r->s on ids with a fresh sampler seeded with `seed`.
static void run_strategy(const session *s, strat_run *r, const int *ids, int n, int n_gen,
                         unsigned long long seed, int stream) {
    sampler smp;
    sample_params sp = s->o->sp;
    sp.seed = seed;
    sampler_init(&smp, &sp, s->m->cfg.vocab);
    r->g = (gen_ctx){.t = s->t, .stream = stream};
    r->rc = run_generate(r->s, s->m, &s->o->so, ids, n, n_gen, &smp, on_token, &r->g, &r->st,
                         r->err, sizeof r->err);
    sampler_free(&smp);
}

static int run_prompt(const session *s, const prompt_in *p, int show_header) {
    const options *o = s->o;
    char err[512];
    int *ids = NULL;
    int n = prompt_ids(s, p, &ids, err, sizeof err);
    int n_gen = o->n_predict < 0 ? s->n_ctx - n : o->n_predict;
    if (n >= 0 && (n_gen < 1 || (long)n + n_gen > s->n_ctx)) {
        snprintf(err, sizeof err,
                 "prompt '%s' has %d tokens; with %d to generate that exceeds the context size %d "
                 "(raise -c or lower -n)", p->label, n, o->n_predict < 0 ? 1 : n_gen, s->n_ctx);
        n = -1;
    }
    if (n < 0) {
        if (o->json) print_json_error(p->label, NULL, err);
        fprintf(stderr, "sift: error: %s\n", err);
        free(ids);
        return -1;
    }
    unsigned long long seed = o->seed >= 0 ? (unsigned long long)o->seed
                                           : (unsigned long long)(now_ms() * 1000) & 0xffffffffULL;
    int ns = o->n_strategies, failed = 0;
    strat_run *runs = xcalloc((size_t)ns, sizeof *runs);
    if (!o->quiet)
        fprintf(stderr, "sift: %s: %d prompt tokens, up to %d new (seed %llu)\n", p->label, n, n_gen, seed);
    for (int i = 0; i < ns; i++) {
        strat_run *r = &runs[i];
        r->s = o->strategies[i];
        if (!o->json && (show_header || ns > 1)) {
            if (ns > 1 && show_header) printf("==> %s [%s] <==\n", p->label, r->s->name);
            else printf("==> %s <==\n", ns > 1 ? r->s->name : p->label);
            fflush(stdout);
        }
        run_strategy(s, r, ids, n, n_gen, seed, !o->json);
        if (r->rc) {
            fprintf(stderr, "sift: error: %s: %s\n", r->s->name, r->err);
            failed = 1;
        } else {
            if (!o->json) printf("\n");
            if (!o->quiet) print_timing(o, r, s->load_ms, s->dev);
        }
    }
    compare_with_full(runs, ns, n, s->m->cfg.n_layer);
    for (int i = 0; i < ns && o->json; i++) {
        if (runs[i].rc) print_json_error(p->label, runs[i].s->name, runs[i].err);
        else print_json(p->label, s->model_name, &runs[i], s->load_ms, s->dev, seed);
    }
    if (ns > 1 && !o->json) print_table(runs, ns);
    for (int i = 0; i < ns; i++) {
        free(runs[i].g.text.buf);
        free(runs[i].g.ids);
    }
    free(runs);
    free(ids);
    return failed ? -1 : 0;
}

// Prefill progress on an interactive stderr: "prefill: layer 12/30".
static void show_layer(void *ctx, int layer, int n_layer, int rows) {
    (void)ctx;
    fprintf(stderr, "\rprefill: layer %d/%d (%d rows)   ", layer + 1, n_layer, rows);
    if (layer + 1 == n_layer) fprintf(stderr, "\r%40s\r", "");
}


// Runs every prompt of o on the loaded model; the number that failed.
static int run_all(const session *s) {
    const options *o = s->o;
    char err[512];
    int failed = 0;
    if (o->prompt) {
        prompt_in p = {"prompt", (char *)o->prompt, strlen(o->prompt)};
        failed += run_prompt(s, &p, 0) != 0;
    }
    for (int i = 0; i < o->n_files; i++) {
        prompt_in p = {o->files[i], NULL, 0};
        p.text = cli_read_all(o->files[i], &p.len, err, sizeof err);
        if (!p.text) {
            if (o->json) print_json_error(p.label, NULL, err);
            fprintf(stderr, "sift: error: %s\n", err);
            failed++;
            continue;
        }
        failed += run_prompt(s, &p, o->n_files > 1) != 0;
        free(p.text);
    }
    return failed;
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
    cli_hw hw = {o.device, o.threads, o.weights, o.ctx, GGML_F32};
    int rc = cli_load(&L, o.model, o.draft_path, &hw, o.strategies,
                      o.n_strategies, &o.so);
    if (rc == 0) {
        model *m = L.m;
        const char *dev = L.bk->name;
        if (!o.quiet && isatty(2)) m->on_layer = show_layer;
        session s = {.o = &o, .m = m, .t = L.t, .dev = dev, .load_ms = now_ms() - t0,
                     .n_ctx = o.ctx > 0 ? o.ctx : m->cfg.ctx_len,
                     .model_name = m->name ? m->name : cli_base_name(L.path)};
        if (!o.quiet)
            fprintf(stderr, "sift: loaded %s (%s, %d layers, %.0fM params, %.2f GiB) in %.0f ms on "
                    "%s%s%s%s\n", cli_base_name(L.path), m->cfg.arch, m->cfg.n_layer,
                    m->n_params / 1e6, m->weight_bytes / 1073741824.0, s.load_ms, dev,
                    L.bk->info[0] ? " (" : "", L.bk->info, L.bk->info[0] ? ")" : "");
        if (o.ctx > m->cfg.ctx_len && !o.quiet)
            fprintf(stderr, "sift: warning: -c %d is beyond the model's trained context %d\n", o.ctx,
                    m->cfg.ctx_len);
        rc = run_all(&s) ? 1 : 0;
    }
    cli_unload(&L);
    for (int i = 0; i < o.n_files; i++) free(o.files[i]);
    free(o.files);
    return rc;
}
