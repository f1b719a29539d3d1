// cmd/ppl.c — `sift ppl`: perplexity of a text, in llama.cpp's llama-perplexity convention so the
// numbers compare: the text is tokenized whole (BOS first when the model adds one), cut into
// chunks of --ctx tokens (a remainder shorter than --ctx is dropped), each chunk is run on its
// own with its first token replaced by BOS, and only the second half is scored: the logits at
// positions ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1. PPL = exp(mean NLL), ± its standard
// error (delta method). Only `full` gives every position's logits; other strategies are refused.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../util/check.h"
#include "cmd.h"
#include "flags.h"

#define PPL_BATCH 256   // rows per forward pass (their logits: 256 x vocab floats)

typedef struct {
    const char *model, *file, *device, *out;   // out: -o FILE (else stdout)
    enum bk_weights weights;   // --weights native|fast|exact|f32 (CPU)
    const char *cache_k, *cache_v;   // --cache-type-k/-v (kvrow.h names; "auto": cli_kv_default)
    int ctx, threads, json, quiet, chunks;     // chunks: --chunks N (0: all)
    const strategy *s;
} ppl_opts;

static void ppl_parse(int argc, char **argv, ppl_opts *p) {
    flag_set f;
    flags_parse(&f, SUB_PPL, argc, argv, 2);
    const flag_val *v = f.v;
    *p = (ppl_opts){.model = v[FL_MODEL].s, .ctx = (int)v[FL_CTX].i, .device = cli_device(v[FL_DEVICE].s),
                    .weights = cli_weights(v[FL_WEIGHTS].s), .cache_k = v[FL_CACHE_TYPE_K].s,
                      .cache_v = v[FL_CACHE_TYPE_V].s, .threads = (int)v[FL_THREADS].i,
                    .json = v[FL_JSON].given > 0, .quiet = flag_verbosity == 0, .out = v[FL_OUTPUT].s,
                    .chunks = v[FL_CHUNKS].given ? (int)v[FL_CHUNKS].i : 0, .s = strategy_find(v[FL_STRATEGY].s)};
    if (!p->s) cli_usage_error("unknown strategy '%s' (available: %s)", v[FL_STRATEGY].s, strategy_names());
    if (strcmp(p->s->name, "full") != 0)
        cli_usage_error("ppl: strategy '%s' changes the prompt's forward pass, so it has no logits at "
                        "every position to score; ppl supports: full", p->s->name);
    if (f.n_files > 1) cli_usage_error("ppl scores one text: give one -f FILE");
    if (f.n_files == 0) cli_usage_error("ppl: no text: give -f FILE");
    p->file = f.files[0];
    if (p->ctx < 4) cli_usage_error("ppl: -c %d: a chunk needs at least 4 tokens", p->ctx);
    if (p->threads == 0) p->threads = backend_cpu_default_threads(NULL);
    flags_done(&f);
}

// -log softmax(logits)[target]
static double nll(const float *logits, int vocab, int target) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < vocab; i++) s += exp(logits[i] - mx);
    return mx + log(s) - logits[target];
}

// NLL of one chunk ids (ctx,) added to *sum / *sum2, scored as in the header; -1 on OOM.
static int score_chunk(context *cx, const int *ids, int ctx, double *sum, double *sum2, char *err,
                       size_t errlen) {
    const model *m = cx->m;
    int vocab = m->cfg.vocab, first = ctx / 2;
    int *caps = xmalloc((size_t)m->cfg.n_layer * sizeof(int)), *pos = xmalloc((size_t)ctx * sizeof(int));
    for (int l = 0; l < m->cfg.n_layer; l++) caps[l] = ctx;
    for (int i = 0; i < ctx; i++) pos[i] = i;
    kv_cache *kv = fwd_kv_create(cx, caps, err, errlen);
    float *logits = kv ? xmalloc((size_t)PPL_BATCH * vocab * sizeof(float)) : NULL;
    for (int b = 0; kv && b < ctx; b += PPL_BATCH) {
        int nb = ctx - b < PPL_BATCH ? ctx - b : PPL_BATCH;
        fwd_run(cx, kv, ids + b, pos + b, nb, NULL, logits, 1);
        for (int i = b; i < b + nb; i++)
            if (i >= first && i + 1 < ctx) {   // row i predicts token i + 1
                double x = nll(logits + (size_t)(i - b) * vocab, vocab, ids[i + 1]);
                *sum += x, *sum2 += x * x;
            }
    }
    int rc = kv ? 0 : -1;
    if (kv) kv_free(kv);
    free(logits);
    free(caps);
    free(pos);
    return rc;
}

// Tokens of the whole text (BOS first when the model adds one) or -1 (error printed).
static int text_ids(const ppl_opts *p, const tok *t, int **ids) {
    char err[512];
    size_t len;
    char *text = tok_read_text(p->file, &len, err, sizeof err);
    if (!text) {
        fprintf(stderr, "sift: error: %s\n", err);
        return -1;
    }
    int n = -1;
    if (tok_text_check(text, len, p->file, err, sizeof err) == 0)
        n = tok_encode_prompt(t, text, len, 0, ids, err, sizeof err);
    free(text);
    if (n < 0) fprintf(stderr, "sift: error: %s\n", err);
    return n;
}

static int run_ppl(const ppl_opts *p, loaded *L) {
    int *ids = NULL, n = text_ids(p, L->t, &ids);
    if (n < 0) return 1;
    int n_chunk = n / p->ctx, scored = p->ctx - 1 - p->ctx / 2;
    if (n_chunk == 0 || p->ctx > L->m->cfg.ctx_len) {
        if (n_chunk == 0)
            fprintf(stderr, "sift: error: %s has %d token%s, fewer than one chunk of -c %d\n",
                    p->file, n, plural_s(n), p->ctx);
        else
            fprintf(stderr, "sift: error: -c %d is beyond the model's context %d\n", p->ctx,
                    L->m->cfg.ctx_len);
        free(ids);
        return n_chunk == 0 ? 1 : 2;
    }
    if (p->chunks > 0 && p->chunks < n_chunk) n_chunk = p->chunks;   // --chunks: the first N
    if (!p->quiet)
        fprintf(stderr, "sift: ppl: %d token%s, %d chunk%s of %d; scoring the second half of each "
                        "chunk (%d token%s), BOS at each chunk's start (llama-perplexity's convention)\n",
                n, plural_s(n), n_chunk, plural_s(n_chunk), p->ctx, scored, plural_s(scored));
    double sum = 0, sum2 = 0, t0 = now_ms();
    char err[512];
    int bos = tok_bos(L->t);
    for (int c = 0; c < n_chunk; c++) {
        int *chunk = ids + (size_t)c * p->ctx;
        if (tok_add_bos(L->t) && bos >= 0) chunk[0] = bos;
        if (score_chunk(L->cx, chunk, p->ctx, &sum, &sum2, err, sizeof err)) {
            fprintf(stderr, "sift: error: %s\n", err);
            free(ids);
            return 1;
        }
        if (!p->quiet) fprintf(stderr, "[%d]%.4f%s", c + 1, exp(sum / ((c + 1.0) * scored)),
                               c + 1 == n_chunk ? "\n" : ",");
    }
    double N = (double)n_chunk * scored, mean = sum / N, var = sum2 / N - mean * mean;
    double ppl = exp(mean), sd = N > 1 && var > 0 ? ppl * sqrt(var / (N - 1)) : 0;
    double ms = now_ms() - t0;
    if (cli_stdout_to(p->out)) {
        free(ids);
        return 1;
    }
    if (p->json)
        printf("{\"file\":\"%s\",\"model\":\"%s\",\"strategy\":\"%s\",\"ctx\":%d,\"chunks\":%d,"
               "\"tokens_scored\":%.0f,\"nll_mean\":%.6f,\"ppl\":%.6f,\"ppl_stderr\":%.6f,"
               "\"ms\":%.1f,\"convention\":\"llama-perplexity: BOS per chunk, second half scored\"}\n",
               cli_base_name(p->file), L->m->name ? L->m->name : cli_base_name(L->path),
               p->s->name, p->ctx, n_chunk, N, mean, ppl, sd, ms);
    else
        printf("Final estimate: PPL = %.4f +/- %.5f (%s, ctx %d, %d chunk%s, %.0f token%s scored, "
               "%.1f s)\n", ppl, sd, p->s->name, p->ctx, n_chunk, plural_s(n_chunk), N,
               plural_s((long long)N), ms / 1000);
    free(ids);
    return 0;
}

int cmd_ppl(int argc, char **argv) {
    ppl_opts p;
    ppl_parse(argc, argv, &p);
    if (cli_refuse_synthetic(p.model, "ppl")) return 2;
    if (cli_check_outputs(&p.out, (const char *[]){"-o"}, 1)) return 2;
    loaded L;
    strategy_opts so = strategy_opts_default();
    cli_hw hw = {p.device, p.threads, p.weights, p.ctx, GGML_F32, p.cache_k, p.cache_v, 0};   // ppl runs its own 256-row passes
    int rc = cli_load(&L, p.model, NULL, &hw, &p.s, 1, &so, NULL);
    if (rc == 0) rc = run_ppl(&p, &L);
    cli_unload(&L);
    return rc;
}
