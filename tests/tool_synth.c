// tests/tool_synth.c — synthetic weights for the Python tests (tests/test_bench.py).
// usage: tool_synth values SEED TENSOR ROWS COLS SCALE OFFSET
//          prints the CPU backend's weight_synth tensor (ROWS, COLS), one value per line (%.9g),
//          read back through the embed op (row r = embedding of token r)
//        tool_synth forward synthetic:NAME[@SEED] N_PROMPT N_GEN
//          runs N_PROMPT seeded random tokens through every layer, then N_GEN greedy decode
//          steps, printing JSON lines: {"params":...}, per layer {"layer","rms","max_abs",
//          "finite"} of the residual stream, per step {"step","token","finite","std","max"} of
//          the logits.
//        tool_synth freqs synthetic:NAME
//          prints the config's RoPE inverse frequencies (head_dim/2), one per line (%.9g)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../policies/policy.h"
#include "../util/check.h"
#include "tool_weights.h"

static int values(char **argv) {
    backend *bk = backend_cpu_create(0, tool_weights());
    int rows = atoi(argv[4]), cols = atoi(argv[5]);
    bk_weight *w = bk->weight_synth(bk, strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                                    (size_t)rows, (size_t)cols, (float)atof(argv[6]),
                                    (float)atof(argv[7]));
    int *ids = xmalloc((size_t)rows * sizeof(int));
    for (int r = 0; r < rows; r++) ids[r] = r;
    size_t n = (size_t)rows * cols;
    void *dev = bk->alloc(bk, n);
    float *host = xmalloc(n * sizeof(float));
    bk->embed(bk, dev, w, ids, rows, cols);
    bk->to_host(bk, host, dev, n);
    for (size_t i = 0; i < n; i++) printf("%.9g\n", host[i]);
    free(host);
    free(ids);
    bk->free(bk, dev);
    bk->weight_free(bk, w);
    bk->destroy(bk);
    return 0;
}

// after_layer hook: statistics of the residual stream (all alive rows).
static int layer_stats(void *ctx, fwd_state *s, int l) {
    (void)ctx;
    size_t n = (size_t)s->n * s->m->cfg.d_model;
    float *x = xmalloc(n * sizeof(float));
    s->m->bk->to_host(s->m->bk, x, s->x, n);
    double ss = 0, mx = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        finite &= isfinite(x[i]) != 0;
        ss += (double)x[i] * x[i];
        mx = fmax(mx, fabs(x[i]));
    }
    printf("{\"layer\":%d,\"rms\":%.6g,\"max_abs\":%.6g,\"finite\":%d}\n", l, sqrt(ss / n), mx,
           finite);
    free(x);
    return 0;
}

static int logit_stats(int step, const float *z, int vocab) {
    double s = 0, q = 0, mx = -INFINITY;
    int finite = 1, arg = 0;
    for (int i = 0; i < vocab; i++) {
        finite &= isfinite(z[i]) != 0;
        s += z[i];
        if (z[i] > mx) mx = z[i], arg = i;
    }
    for (int i = 0; i < vocab; i++) q += (z[i] - s / vocab) * (z[i] - s / vocab);
    printf("{\"step\":%d,\"token\":%d,\"finite\":%d,\"std\":%.6g,\"max\":%.6g}\n", step, arg, finite,
           sqrt(q / vocab), mx);
    return arg;
}

static int forward(char **argv) {
    char err[512];
    synth_shape sh;
    if (synth_parse(argv[2], &sh, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    backend *bk = backend_cpu_create(0, tool_weights());
    model *m = model_load_synth(&sh, bk, err, sizeof err);
    CHECK_INTERNAL(m, "%s", err);
    context *cx = ctx_new(m, NULL);
    int P = atoi(argv[3]), G = atoi(argv[4]), V = m->cfg.vocab;
    printf("{\"params\":%zu}\n", m->n_params);
    int *caps = xmalloc((size_t)m->cfg.n_layer * sizeof(int)), *ids = xmalloc((size_t)P * sizeof(int));
    int *pos = xmalloc((size_t)P * sizeof(int));
    for (int l = 0; l < m->cfg.n_layer; l++) caps[l] = P + G;
    for (int i = 0; i < P; i++) ids[i] = (int)(synth_mix((uint64_t)i) % (uint64_t)V), pos[i] = i;
    kv_cache *kv = fwd_kv_create(cx, caps, err, sizeof err);
    CHECK_INTERNAL(kv, "%s", err);
    float *logits = xmalloc((size_t)V * sizeof(float));
    fwd_hooks hooks = {.after_layer = layer_stats};
    fwd_run(cx, kv, ids, pos, P, &hooks, logits, 0);
    int tok = logit_stats(0, logits, V);
    for (int t = 1; t <= G; t++) {
        int p = P + t - 1;
        fwd_run(cx, kv, &tok, &p, 1, NULL, logits, 0);
        tok = logit_stats(t, logits, V);
    }
    kv_free(kv);
    free(logits);
    free(caps);
    free(ids);
    free(pos);
    ctx_free(cx);
    model_free(m);
    bk->destroy(bk);
    return 0;
}

static int freqs(char **argv) {
    char err[512];
    synth_shape sh;
    if (synth_parse(argv[2], &sh, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    model_config c;
    model_config_synth(&sh, &c);
    for (int j = 0; j < c.head_dim / 2; j++) printf("%.9g\n", c.inv_freq[j]);
    free(c.inv_freq);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 8 && strcmp(argv[1], "values") == 0) return values(argv);
    if (argc == 5 && strcmp(argv[1], "forward") == 0) return forward(argv);
    if (argc == 3 && strcmp(argv[1], "freqs") == 0) return freqs(argv);
    fprintf(stderr, "usage: tool_synth values SEED TENSOR ROWS COLS SCALE OFFSET\n"
                    "       tool_synth forward synthetic:NAME[@SEED] N_PROMPT N_GEN\n"
                    "       tool_synth freqs synthetic:NAME\n");
    return 2;
}
