// tests/tool_phi.c — drives the topk+phi kernels and decode path for tests/test_phi.py.
// usage:
//   tool_phi attend IN.bin OUT.bin
//     IN: int32 kind, hd, d_emb, d_hid, d_phi, n, n_sel, n_sub, lo, hi; float32 par_q (n_par),
//     par_k (n_par), q (hd,), K (n, hd), V (n, hd); int32 sel (n_sel,).
//     OUT float32: log phi_q(q) (d_phi,), summary of rows [lo, hi): m (d_phi,), u (d_phi,),
//     T (d_phi, hd); y with completion (hd,); y selection only (hd,); y with completion from
//     memoised key features (phi_summary_memo) (hd,).
//   tool_phi fit IN.bin INIT.phi FIT.phi
//     IN: int32 hd, d_emb, d_hid, d_phi, n_keys, n_q, n_train, steps, seed, lo; float32
//     K (n_keys, hd), Q (n_q, hd); int32 end (n_q,). One head fitted on queries [0, n_train)
//     (support keys [lo, end[i])), minibatches of 16, lr 1e-2, mass calibration; writes the initial and fitted
//     maps as .phi files (1 layer, 1 head) and prints the loss over the training queries before
//     and after, and the first and last minibatch losses.
//   tool_phi calibrate IN.bin FIT.phi FRAC MARGIN CAL.phi
//     IN as for fit; FIT.phi's head is calibrated on queries [0, n_train) with phi_fit_calibrate
//     at FRAC and MARGIN and written to CAL.phi; prints the remainder bias at FRAC over those
//     queries before and after, and its standard deviation before.
//   tool_phi remainder MODEL IDS.txt K PHI|prf
//     full prefill of the ids (whitespace-separated) logging each layer's last query; then per
//     layer, averaged over query heads, the decode step topk / topk+phi would make at that
//     query (prompt regions as policies/topk_phi.c: N = n - 1, sink 4, tail 16): relative error
//     of the topk and topk+phi outputs vs full attention, the true remainder's share of the
//     softmax mass, log(estimated / true remainder mass), cosine of the estimated and true
//     remainder value means, and the error with the true mass and the estimated mean.
//   tool_phi decode MODEL OUT.f32 [--strategy S] [--set KEY=VALUE]... [--cont ID]... ID...
//     prefill ID... with strategy S (default full), then decode the forced continuation --cont
//     ids; OUT = float32 logits (1 + n_cont, vocab): the prefill's, then each decode step's.
//     --set keys: sink, tail, topk, budget, phi (a path). --greedy N instead of --cont: the
//     continuation is N greedy tokens (argmax of the previous row).
//   tool_phi prf MODEL OUT.phi
//     the random features topk+phi falls back to (topk_phi_fallback_maps, d_phi = head dim) as a .phi file.
//   tool_phi compare MODEL ROWS NFREE POS0 VARIANT... -- ID...
//     topk_cmp (fit/phi_fit.h) on the ids at positions POS0..; VARIANT = topk:K,
//     prf:K (random features) or PHI_FILE:K:DELTA (fitted maps, log phi_q shifted by DELTA).
//     Prints one JSON object: full's forced tokens and free tokens, and per variant its KL per
//     row, greedy agreement and free tokens.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/phi.h"
#include "../fit/phi_fit.h"
#include "../attn/score.h"
#include "../policies/policy.h"
#include "../policies/topk_phi.h"
#include "../util/check.h"
#include "tool_weights.h"

static void read_exact(FILE *fp, void *p, size_t bytes) {
    if (fread(p, 1, bytes, fp) != bytes) {
        fprintf(stderr, "short input\n");
        exit(1);
    }
}

static int attend(const char *in, const char *outp) {
    FILE *fp = fopen(in, "rb");
    if (!fp) return 1;
    int h[10];
    read_exact(fp, h, sizeof h);
    int hd = h[1], n = h[5], n_sel = h[6], n_sub = h[7], lo = h[8], hi = h[9];
    phi_maps *p = phi_maps_alloc(&(phi_maps){h[0], 1, 1, 1, hd, h[2], h[3], h[4], NULL, NULL, 0, ""});
    int np = phi_n_par(p), f = p->d_phi;
    float *q = xmalloc(hd * sizeof(float)), *k = xmalloc((size_t)n * hd * sizeof(float));
    float *v = xmalloc((size_t)n * hd * sizeof(float));
    int *sel = xmalloc((size_t)(n_sel ? n_sel : 1) * sizeof(int));
    read_exact(fp, p->q, np * sizeof(float));
    read_exact(fp, p->k, np * sizeof(float));
    read_exact(fp, q, hd * sizeof(float));
    read_exact(fp, k, (size_t)n * hd * sizeof(float));
    read_exact(fp, v, (size_t)n * hd * sizeof(float));
    read_exact(fp, sel, (size_t)n_sel * sizeof(int));
    fclose(fp);

    float *lq = xmalloc(f * sizeof(float)), *y = xmalloc(3 * hd * sizeof(float));
    phi_log_features(p, p->q, q, lq);
    phi_summary s = phi_summary_alloc(f, hd);
    phi_summary_build(&s, p, p->k, k + (size_t)lo * hd, v + (size_t)lo * hd, hi - lo, hd, hd);
    phi_attend_head(y, q, k, v, sel, n_sel, hd, n_sub, p, p->q, p->k, &s);
    phi_attend_head(y + hd, q, k, v, sel, n_sel, hd, n_sub, NULL, NULL, NULL, NULL);
    phi_summary_memo(&s, p, p->k, k, sel, n_sub / 2, hd);   // in two batches, as decode steps do
    phi_summary_memo(&s, p, p->k, k, sel, n_sub, hd);
    phi_attend_head(y + 2 * hd, q, k, v, sel, n_sel, hd, n_sub, p, p->q, p->k, &s);
    FILE *out = fopen(outp, "wb");
    if (!out) return 1;
    fwrite(lq, sizeof(float), f, out);
    fwrite(s.m, sizeof(float), f, out);
    fwrite(s.u, sizeof(float), f, out);
    fwrite(s.t, sizeof(float), (size_t)f * hd, out);
    fwrite(y, sizeof(float), 3 * (size_t)hd, out);
    fclose(out);
    phi_summary_free(&s);
    phi_maps_free(p);
    free(q), free(k), free(v), free(sel), free(lq), free(y);
    return 0;
}

static void first_last(void *ctx, int step, double loss) {
    double *fl = ctx;
    if (step == 1) fl[0] = loss;
    fl[1] = loss;
}

// The fit / calibrate input (see the usage above) as a phi_fit_set of one head, support from
// h[9]; arrays malloc'ed into *k, *q, *end, *head and *train = 0..n_train. h: the 10 header ints.
static phi_fit_set read_fit_input(FILE *fp, int *h, float **k, float **q, int **end, int **head,
                                  int **train) {
    read_exact(fp, h, 10 * sizeof(int));
    int hd = h[0], nk = h[4], nq = h[5], n_train = h[6];
    *k = xmalloc((size_t)nk * hd * 4), *q = xmalloc((size_t)nq * hd * 4);
    *end = xmalloc((size_t)nq * sizeof(int)), *head = xcalloc((size_t)nq, sizeof(int));
    *train = xmalloc((size_t)(n_train ? n_train : 1) * sizeof(int));
    read_exact(fp, *k, (size_t)nk * hd * 4);
    read_exact(fp, *q, (size_t)nq * hd * 4);
    read_exact(fp, *end, (size_t)nq * sizeof(int));
    for (int i = 0; i < n_train; i++) (*train)[i] = i;
    return (phi_fit_set){hd, 1, h[9], nk, nq, *k, *q, *head, *end, NULL, 0, 0};
}

static int fit(const char *in, const char *init_path, const char *fit_path) {
    FILE *fp = fopen(in, "rb");
    if (!fp) return 1;
    int h[10], *end, *head, *train;
    float *k, *q;
    phi_fit_set d = read_fit_input(fp, h, &k, &q, &end, &head, &train);
    fclose(fp);
    int n_train = h[6], steps = h[7];
    phi_maps *p = phi_maps_mlp(1, 1, 1, d.hd, h[1], h[2], h[3]);
    float *theta = xmalloc(2 * (size_t)phi_n_par(p) * 4);
    char err[256];
    phi_fit_init(p, theta, 1, (uint64_t)h[8]);
    memcpy(p->q, theta, (size_t)phi_n_par(p) * 4);
    memcpy(p->k, theta + phi_n_par(p), (size_t)phi_n_par(p) * 4);
    double before = phi_fit_loss(p, theta, &d, train, n_train, NULL, NULL), fl[2];
    if (phi_maps_save(p, init_path, err, sizeof err)) return 1;
    phi_fit_run(p, theta, &d, train, n_train, steps, 16, 1e-2f, (uint64_t)h[8], first_last, fl);
    phi_fit_calibrate(p, theta, &d, train, n_train, 0, 0);
    memcpy(p->q, theta, (size_t)phi_n_par(p) * 4);
    memcpy(p->k, theta + phi_n_par(p), (size_t)phi_n_par(p) * 4);
    double after = phi_fit_loss(p, theta, &d, train, n_train, NULL, NULL);
    if (phi_maps_save(p, fit_path, err, sizeof err)) return 1;
    printf("%.9g %.9g %.9g %.9g\n", before, after, fl[0], fl[1]);
    phi_maps_free(p);
    free(k), free(q), free(end), free(head), free(train), free(theta);
    return 0;
}

static int calibrate(const char *in, const char *fit_path, double frac, double margin,
                     const char *cal_path) {
    FILE *fp = fopen(in, "rb");
    char err[256];
    phi_maps *p = phi_maps_load(fit_path, err, sizeof err);
    if (!fp || !p) return 1;
    int h[10], *end, *head, *train, np = phi_n_par(p);
    float *k, *q;
    phi_fit_set d = read_fit_input(fp, h, &k, &q, &end, &head, &train);
    fclose(fp);
    int n_train = h[6];
    float *theta = xmalloc(2 * (size_t)np * 4);
    memcpy(theta, p->q, (size_t)np * 4);
    memcpy(theta + np, p->k, (size_t)np * 4);
    const float *pq[1] = {theta};
    double sd, before = phi_fit_remainder_bias(p, pq, theta + np, &d, train, n_train, frac, &sd);
    phi_fit_calibrate(p, theta, &d, train, n_train, frac, margin);
    double after = phi_fit_remainder_bias(p, pq, theta + np, &d, train, n_train, frac, NULL);
    memcpy(p->q, theta, (size_t)np * 4);
    if (phi_maps_save(p, cal_path, err, sizeof err)) return 1;
    printf("%.9g %.9g %.9g\n", before, after, sd);
    phi_maps_free(p);
    free(k), free(q), free(end), free(head), free(train), free(theta);
    return 0;
}

typedef struct {
    float **q;   // per layer: the last position's queries (heads, hd)
} last_q;

static int log_last_q(void *ctx, fwd_state *s, int l, const void *q) {
    last_q *g = ctx;
    size_t row = (size_t)s->m->cfg.n_head * s->m->cfg.head_dim;
    g->q[l] = xmalloc(row * sizeof(float));
    memcpy(g->q[l], (const float *)q + (size_t)(s->n - 1) * row, row * sizeof(float));
    return 0;
}

// One head's decode step at query q over keys/values k, v (n, hd); acc[0..6) += the metrics.
static void remainder_head(double *acc, const float *q, const float *k, const float *v, int n,
                           int hd, int K, const phi_maps *p, const float *pq, const float *pk) {
    const int sink = 4, tail = 16, lo = sink, hi = n - 1 - tail, nf = p->d_phi;
    double *s = xmalloc((size_t)n * 8), mx = -INFINITY, z = 0, zr = 0;
    double *yf = xcalloc((size_t)hd, 8), *yr = xcalloc((size_t)hd, 8), *ye = xcalloc((size_t)hd, 8);
    for (int i = 0; i < n; i++) {   // s = q . K / sqrt(hd)
        double dot = 0;
        for (int j = 0; j < hd; j++) dot += (double)q[j] * k[(size_t)i * hd + j];
        s[i] = dot / sqrt((double)hd);
        mx = fmax(mx, s[i]);
    }
    float *sm = xmalloc((size_t)(hi - lo) * sizeof(float));
    int *idx = xmalloc((size_t)(K + n) * sizeof(int));
    char *in = xcalloc((size_t)n, 1);
    for (int i = lo; i < hi; i++) sm[i - lo] = (float)s[i];
    int nsub = score_topk(sm, hi - lo, K, idx), ns = nsub;
    for (int i = 0; i < nsub; i++) in[idx[i] += lo] = 1;
    for (int i = 0; i < sink; i++) idx[ns++] = i;
    for (int i = hi; i < n; i++) idx[ns++] = i;
    for (int i = 0; i < n; i++) {   // full, and the true remainder M minus top-K
        double w = exp(s[i] - mx);
        z += w;
        for (int j = 0; j < hd; j++) yf[j] += w * v[(size_t)i * hd + j];
        if (i < lo || i >= hi || in[i]) continue;
        zr += w;
        for (int j = 0; j < hd; j++) yr[j] += w * v[(size_t)i * hd + j];
    }
    phi_summary sum = phi_summary_alloc(nf, hd);   // the estimate, as phi_attend_head makes it
    phi_summary_build(&sum, p, pk, k + (size_t)lo * hd, v + (size_t)lo * hd, hi - lo, hd, hd);
    float *lq = xmalloc((size_t)nf * 4), *lk = xmalloc((size_t)nf * 4);
    double *u = xcalloc((size_t)nf, 8), *t = xcalloc((size_t)nf * hd, 8), *a = xmalloc((size_t)nf * 8);
    for (int i = 0; i < nsub; i++) {
        phi_log_features(p, pk, k + (size_t)idx[i] * hd, lk);
        for (int f = 0; f < nf; f++) {
            double w = exp(lk[f] - sum.m[f]);
            u[f] += w;
            for (int j = 0; j < hd; j++) t[(size_t)f * hd + j] += w * v[(size_t)idx[i] * hd + j];
        }
    }
    phi_log_features(p, pq, q, lq);
    double amax = -INFINITY, za = 0;
    for (int f = 0; f < nf; f++) {
        u[f] = fmax(sum.u[f] - u[f], PHI_EPS);
        a[f] = lq[f] + sum.m[f] + log(u[f]);
        amax = fmax(amax, a[f]);
    }
    for (int f = 0; f < nf; f++) {
        double w = exp(a[f] - amax);
        za += w;
        for (int j = 0; j < hd; j++) ye[j] += w * (sum.t[(size_t)f * hd + j] - t[(size_t)f * hd + j]) / u[f];
    }
    float *yt = xmalloc((size_t)hd * 4), *yp = xmalloc((size_t)hd * 4);
    phi_attend_head(yt, q, k, v, idx, ns, hd, nsub, NULL, NULL, NULL, NULL);
    phi_attend_head(yp, q, k, v, idx, ns, hd, nsub, p, pq, pk, &sum);
    double nf2 = 0, et = 0, ep = 0, eo = 0, dot = 0, n1 = 0, n2 = 0;
    for (int j = 0; j < hd; j++) {
        double f = yf[j] / z, e = ye[j] / za, rt = yr[j] / zr;
        double yo = (yf[j] - yr[j] + zr * e) / z;   // exact part + true mass x estimated mean
        nf2 += f * f, et += (yt[j] - f) * (yt[j] - f), ep += (yp[j] - f) * (yp[j] - f);
        eo += (yo - f) * (yo - f), dot += e * rt, n1 += e * e, n2 += rt * rt;
    }
    acc[0] += sqrt(et / nf2), acc[1] += sqrt(ep / nf2), acc[2] += zr / z;
    acc[3] += amax + log(za) - (mx + log(zr)), acc[4] += dot / sqrt(n1 * n2), acc[5] += sqrt(eo / nf2);
    phi_summary_free(&sum);
    free(s), free(yf), free(yr), free(ye), free(sm), free(idx), free(in), free(lq), free(lk);
    free(u), free(t), free(a), free(yt), free(yp);
}

static int remainder_cmd(char **argv) {
    char err[512];
    backend *bk = backend_cpu_create(0, tool_weights());
    gguf_file *f = gguf_open(argv[2], err, sizeof err);
    model *m = f ? model_load_gguf(f, bk, err, sizeof err) : NULL;
    context *cx = m ? ctx_new(m, NULL) : NULL;
    FILE *fp = fopen(argv[3], "r");
    if (!m || !fp) return 1;
    const model_config *c = &m->cfg;
    int cap = 1 << 20, n = 0, *ids = xmalloc((size_t)cap * sizeof(int)), K = atoi(argv[4]);
    while (n < cap && fscanf(fp, "%d", &ids[n]) == 1) n++;
    fclose(fp);
    phi_maps *p = strcmp(argv[5], "prf") ? phi_maps_load(argv[5], err, sizeof err)
                : topk_phi_fallback_maps(m, c->head_dim);
    if (!p || n < 64) {
        fprintf(stderr, "%s\n", p ? "need >= 64 ids" : err);
        return 1;
    }
    last_q g = {xcalloc((size_t)c->n_layer, sizeof(float *))};
    fwd_hooks hooks = {.ctx = &g, .after_attention = log_last_q};
    prefill_info info = {0};
    kv_cache *kv = prefill_run(cx, ids, n, 0, NULL, &hooks, NULL, &info, err, sizeof err);
    if (!kv) return 1;
    int hd = c->head_dim, group = c->n_head / c->n_kv_head;
    printf("n %d K %d maps %s\n| layer | err topk | err topk+phi | remainder share | log(est/true "
           "mass) | cos(est, true mean) | err with true mass |\n|---:|---:|---:|---:|---:|---:|---:|\n",
           n, K, argv[5]);
    double mean[6] = {0};
    for (int l = 0; l < c->n_layer; l++) {
        const kv_layer *L = &kv->layers[l];
        double acc[6] = {0};
        for (int h = 0; h < c->n_head; h++) {
            size_t off = (size_t)(h / group) * L->cap * hd;
            remainder_head(acc, g.q[l] + (size_t)h * hd, (const float *)L->k + off,
                           (const float *)L->v + off, n, hd, K, p, phi_par_q(p, l, h),
                           phi_par_k(p, l, h / group));
        }
        printf("| %d |", l);
        for (int i = 0; i < 6; i++) printf(" %.4f |", acc[i] / c->n_head), mean[i] += acc[i] / c->n_head / c->n_layer;
        printf("\n");
        free(g.q[l]);
    }
    printf("| mean |");
    for (int i = 0; i < 6; i++) printf(" %.4f |", mean[i]);
    printf("\n");
    kv_free(kv), phi_maps_free(p), ctx_free(cx), model_free(m), gguf_close(f), bk->destroy(bk);
    free(g.q), free(ids);
    return 0;
}

static int set_opt(strategy_opts *o, const char *kv) {
    const char *eq = strchr(kv, '=');
    if (!eq) return -1;
    const char *v = eq + 1;
    size_t n = (size_t)(eq - kv);
    if (n == 4 && !strncmp(kv, "sink", 4)) o->sink = atoi(v);
    else if (n == 4 && !strncmp(kv, "tail", 4)) o->tail = atoi(v);
    else if (n == 4 && !strncmp(kv, "topk", 4)) o->topk = atoi(v);
    else if (n == 6 && !strncmp(kv, "budget", 6)) o->budget = (float)atof(v);
    else if (n == 3 && !strncmp(kv, "phi", 3)) o->phi_path = v;
    else return -1;
    return 0;
}

static int decode(int argc, char **argv) {
    const char *sname = "full";
    strategy_opts o = strategy_opts_default();
    int a = 4, *cont = xmalloc((size_t)(argc + 1024) * sizeof(int)), n_cont = 0, greedy = 0;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "--strategy")) sname = argv[a + 1];
        else if (!strcmp(argv[a], "--greedy")) n_cont = greedy = atoi(argv[a + 1]) < 1024 ? atoi(argv[a + 1]) : 1024;
        else if (!strcmp(argv[a], "--cont")) cont[n_cont++] = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--set") || set_opt(&o, argv[a + 1])) {
            fprintf(stderr, "bad option %s %s\n", argv[a], argv[a + 1]);
            return 2;
        }
    }
    int n = argc - a, *ids = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[a + i]);
    char err[512];
    backend *bk = backend_cpu_create(0, tool_weights());
    gguf_file *f = gguf_open(argv[2], err, sizeof err);
    model *m = f ? model_load_gguf(f, bk, err, sizeof err) : NULL;
    context *cx = m ? ctx_new(m, NULL) : NULL;
    const strategy *s = strategy_find(sname);
    if (!m || !s || n < 1 || (strategy_check(s, m, &o, err, sizeof err))) {
        fprintf(stderr, "%s\n", !s ? "unknown strategy" : n < 1 ? "no ids" : err);
        return 1;
    }
    int vocab = m->cfg.vocab;
    float *logits = xmalloc((size_t)(1 + n_cont) * vocab * sizeof(float));
    prefill_info info = {0};
    kv_cache *kv = strategy_prefill(s, cx, ids, n, n_cont, &o, NULL, logits, &info, err, sizeof err);
    if (!kv) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (int t = 0; t < n_cont; t++) {
        int pos = n + t;
        if (greedy) {   // argmax of the previous row
            const float *prev = logits + (size_t)t * vocab;
            cont[t] = 0;
            for (int j = 1; j < vocab; j++)
                if (prev[j] > prev[cont[t]]) cont[t] = j;
        }
        fwd_run(cx, kv, &cont[t], &pos, 1, info.decode.attention ? &info.decode : NULL,
                logits + (size_t)(1 + t) * vocab, 0);
    }
    FILE *out = fopen(argv[3], "wb");
    if (!out) return 1;
    fwrite(logits, sizeof(float), (size_t)(1 + n_cont) * vocab, out);
    fclose(out);
    if (info.note[0]) fprintf(stderr, "note: %s\n", info.note);
    kv_free(kv);
    ctx_free(cx);
    model_free(m);
    gguf_close(f);
    bk->destroy(bk);
    free(logits), free(ids), free(cont);
    return 0;
}

static int compare_cmd(int argc, char **argv) {
    int rows = atoi(argv[3]), n_free = atoi(argv[4]), pos0 = atoi(argv[5]), a = 6, n_v = 0;
    struct {
        const phi_maps *maps;
        int k;
    } v[32];
    phi_maps *own[32] = {0};
    char err[512];
    backend *bk = backend_cpu_create(0, tool_weights());
    gguf_file *f = gguf_open(argv[2], err, sizeof err);
    model *m = f ? model_load_gguf(f, bk, err, sizeof err) : NULL;
    context *cx = m ? ctx_new(m, NULL) : NULL;
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const model_config *c = &m->cfg;
    for (; a < argc && strcmp(argv[a], "--") && n_v < 32; a++, n_v++) {
        char path[1024];
        float delta = 0;
        int k = 0;
        if (sscanf(argv[a], "topk:%d", &k) == 1) v[n_v] = (__typeof__(v[0])){NULL, k};
        else if (sscanf(argv[a], "prf:%d", &k) == 1) {
            own[n_v] = topk_phi_fallback_maps(m, c->head_dim);
            v[n_v] = (__typeof__(v[0])){own[n_v], k};
        } else if (sscanf(argv[a], "%1023[^:]:%d:%f", path, &k, &delta) == 3) {
            own[n_v] = phi_maps_load(path, err, sizeof err);
            if (!own[n_v]) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            if (delta != 0) phi_maps_shift_q(own[n_v], delta);
            v[n_v] = (__typeof__(v[0])){own[n_v], k};
        } else {
            fprintf(stderr, "bad variant %s\n", argv[a]);
            return 2;
        }
    }
    int n = argc - a - 1, *ids = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[a + 1 + i]);
    double *kl = xmalloc((size_t)(n_v ? n_v : 1) * rows * sizeof(double)), agree[32];
    int *full = xmalloc((size_t)rows * sizeof(int)), *fr = xmalloc((size_t)(n_v + 1) * (n_free + 1) * sizeof(int));
    topk_cmp *cmp = topk_cmp_begin(cx, ids, n, pos0, 4, 16, rows, n_free, err, sizeof err);
    if (!cmp) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    memcpy(full, topk_cmp_full(cmp, 0), (size_t)rows * sizeof(int));
    memcpy(fr, topk_cmp_full(cmp, 1), (size_t)n_free * sizeof(int));
    for (int i = 0; i < n_v; i++)
        topk_cmp_run(cmp, v[i].maps, v[i].k, kl + (size_t)i * rows, &agree[i], fr + (size_t)(i + 1) * n_free);
    topk_cmp_end(cmp);
    printf("{\"full_tok\": [");
    for (int r = 0; r < rows; r++) printf("%s%d", r ? ", " : "", full[r]);
    printf("], \"full_free\": [");
    for (int r = 0; r < n_free; r++) printf("%s%d", r ? ", " : "", fr[r]);
    printf("], \"variants\": [");
    for (int i = 0; i < n_v; i++) {
        printf("%s{\"spec\": \"%s\", \"agree\": %.6f, \"kl\": [", i ? ", " : "", argv[6 + i], agree[i]);
        for (int r = 0; r < rows; r++) printf("%s%.6g", r ? ", " : "", kl[(size_t)i * rows + r]);
        printf("], \"free\": [");
        for (int r = 0; r < n_free; r++) printf("%s%d", r ? ", " : "", fr[(size_t)(i + 1) * n_free + r]);
        printf("]}");
    }
    printf("]}\n");
    for (int i = 0; i < n_v; i++) phi_maps_free(own[i]);
    ctx_free(cx), model_free(m), gguf_close(f), bk->destroy(bk);
    free(ids), free(kl), free(full), free(fr);
    return 0;
}

// tool_phi prf MODEL OUT.phi: the random features topk+phi falls back to, as a .phi file.
static int prf_cmd(const char *model_path, const char *out) {
    char err[512];
    gguf_file *f = gguf_open(model_path, err, sizeof err);
    if (!f) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    backend *bk = backend_cpu_create(0, tool_weights());
    model *m = model_load_gguf(f, bk, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const model_config *c = &m->cfg;
    phi_maps *p = topk_phi_fallback_maps(m, c->head_dim);
    int rc = phi_maps_save(p, out, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    phi_maps_free(p), model_free(m), gguf_close(f), bk->destroy(bk);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc >= 8 && !strcmp(argv[1], "compare")) return compare_cmd(argc, argv);
    if (argc == 4 && !strcmp(argv[1], "prf")) return prf_cmd(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "attend")) return attend(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "fit")) return fit(argv[2], argv[3], argv[4]);
    if (argc >= 5 && !strcmp(argv[1], "decode")) return decode(argc, argv);
    if (argc == 6 && !strcmp(argv[1], "remainder")) return remainder_cmd(argv);
    if (argc == 7 && !strcmp(argv[1], "calibrate"))
        return calibrate(argv[2], argv[3], atof(argv[4]), atof(argv[5]), argv[6]);
    fprintf(stderr, "usage: tool_phi attend IN OUT | fit IN INIT FIT | calibrate IN FIT FRAC MARGIN CAL |\n"
                    "       remainder MODEL IDS K PHI | decode MODEL OUT [opts] ID...\n");
    return 2;
}
